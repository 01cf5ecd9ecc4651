//! datasets: `zilla get` and `zilla list` in the shapes of zfs get and zfs list.
//!
//! The daemon answers for one dataset at a time (`POST /v1/get` with no property:
//! every property of a volume, or of a pool as zpool get shows them, with exact
//! values). The CLI expands the names it is given (a pool with `-r`, or in `list`,
//! stands for its volumes; no name means every pool and volume), picks the properties
//! (zfs's short names too: `avail`, `refer`, ...), filters by source (`-s`), and prints:
//! two spaces between columns and a header, or with `-H` one tab and no header; values
//! human (`1.50G`, `Wed Dec  2  4:55 2026`, `1.00x`) or with `-p` exact (bytes, unix
//! seconds, `1.00`). A property that a dataset of another type has reads `-` with source
//! `-` (zfs shows `volsize` of a filesystem so); a name no dataset knows is refused.
//! Volumes are the only datasets (no filesystems or snapshots): `list -t filesystem`
//! shows none, and a volume's `mountpoint` is `-`.

use clap::Args;
use zilla_core::props::PropRow;
use zilla_core::spa::{PoolListRow, VolumeInfo};

use crate::api::GetReq;
use crate::client::{enc, Client};
use crate::format::{prop_value, table, Align};

#[derive(Args)]
pub struct GetArgs {
    /// Scripted: no header, one tab between fields
    #[arg(short = 'H')]
    scripted: bool,
    /// Exact values: bytes, unix seconds, ratios without the x
    #[arg(short = 'p')]
    parsable: bool,
    /// A pool named stands for itself and its volumes
    #[arg(short = 'r')]
    recursive: bool,
    /// Fields to show: name,property,value,received,source [default: name,property,value,source]
    #[arg(short = 'o', value_name = "FIELD[,FIELD]...")]
    fields: Option<String>,
    /// Only properties whose source is one of: local,default,inherited,temporary,received,none
    #[arg(short = 's', value_name = "SOURCE[,SOURCE]...")]
    sources: Option<String>,
    /// PROP[,PROP]... or all
    props: String,
    /// POOL/NAME (a volume) or POOL (the pool's properties) [default: every pool and volume]
    names: Vec<String>,
}

#[derive(Args)]
pub struct ListArgs {
    /// Scripted: no header, one tab between fields
    #[arg(short = 'H')]
    scripted: bool,
    /// Exact values: bytes, unix seconds, ratios without the x
    #[arg(short = 'p')]
    parsable: bool,
    /// Recursive (a pool named always stands for its volumes; volumes have no children)
    #[arg(short = 'r')]
    recursive: bool,
    /// Properties to show [default: name,used,available,referenced,mountpoint]
    #[arg(short = 'o', value_name = "PROP[,PROP]...")]
    props: Option<String>,
    /// Types to show: filesystem,volume,snapshot,all [default: filesystem,volume]
    #[arg(short = 't', value_name = "TYPE[,TYPE]...")]
    types: Option<String>,
    /// Sort by this property, ascending (repeatable: later ones break ties)
    #[arg(short = 's', value_name = "PROP")]
    sort_ascending: Vec<String>,
    /// Sort by this property, descending (repeatable)
    #[arg(short = 'S', value_name = "PROP")]
    sort_descending: Vec<String>,
    /// POOL/NAME or POOL (its volumes) [default: every volume]
    names: Vec<String>,
}

/// zfs's short property names.
fn canonical(prop: &str) -> &str {
    match prop {
        "avail" => "available",
        "refer" => "referenced",
        "refreserv" => "refreservation",
        "volblock" => "volblocksize",
        "lused" => "logicalused",
        "lrefer" => "logicalreferenced",
        "rdonly" => "readonly",
        "compress" => "compression",
        "ratio" => "compressratio",
        p => p,
    }
}

/// The column header `zfs list` prints for a property.
fn header(prop: &str) -> String {
    match prop {
        "available" => "AVAIL".into(),
        "referenced" => "REFER".into(),
        "refreservation" => "REFRESERV".into(),
        "volblocksize" => "VOLBLOCK".into(),
        "logicalused" => "LUSED".into(),
        "logicalreferenced" => "LREFER".into(),
        "readonly" => "RDONLY".into(),
        "compression" => "COMPRESS".into(),
        "compressratio" => "RATIO".into(),
        p => p.to_ascii_uppercase(),
    }
}

/// Every property a volume has, for the names `-o` and `get` accept.
fn volume_property(prop: &str) -> bool {
    matches!(prop, "name" | "mountpoint") || zilla_core::props::find(prop).is_some() || zilla_core::props::READONLY_PROPS.contains(&prop)
}

/// One dataset's properties: its exact rows, with `name` (and `mountpoint` for a volume).
struct Dataset {
    name: String,
    rows: Vec<PropRow>,
}

impl Dataset {
    async fn fetch(c: &Client, name: &str) -> Result<Dataset, String> {
        let req = GetReq { name: name.to_string(), props: vec![] };
        let mut rows: Vec<PropRow> = c.post("/v1/get", &req).await.map_err(crate::ctx(format!("cannot open '{name}'")))?;
        let row = |p: &str, v: &str| PropRow { name: name.to_string(), property: p.into(), value: v.into(), source: "-".into(), note: None };
        if !rows.iter().any(|r| r.property == "name") {
            rows.push(row("name", name));
        }
        if name.contains('/') {
            rows.push(row("mountpoint", "-"));
        }
        Ok(Dataset { name: name.to_string(), rows })
    }

    /// The row of `prop`: its own, or `-` when this dataset's type lacks it.
    fn row(&self, prop: &str) -> PropRow {
        self.rows.iter().find(|r| r.property == prop).cloned().unwrap_or_else(|| PropRow {
            name: self.name.clone(),
            property: prop.to_string(),
            value: "-".into(),
            source: "-".into(),
            note: None,
        })
    }

    fn knows(&self, prop: &str) -> bool {
        self.rows.iter().any(|r| r.property == prop)
    }
}

/// The volumes of `pool` (or of every pool), sorted by name.
async fn volumes_of(c: &Client, pool: Option<&str>) -> Result<Vec<String>, String> {
    let vols: Vec<VolumeInfo> = match pool {
        Some(p) => c.get(&format!("/v1/volumes?pool={}", enc(p))).await.map_err(crate::ctx(format!("cannot open '{p}'")))?,
        None => c.get("/v1/volumes").await?,
    };
    let mut names: Vec<String> = vols.into_iter().map(|v| v.name).collect();
    names.sort();
    Ok(names)
}

async fn pool_names(c: &Client) -> Result<Vec<String>, String> {
    let rows: Vec<PoolListRow> = c.get("/v1/pools").await?;
    let mut names: Vec<String> = rows.into_iter().map(|r| r.name).collect();
    names.sort();
    Ok(names)
}

/// The datasets `get` shows: each name given (a pool with -r: then its volumes), or
/// every pool followed by its volumes.
async fn get_names(c: &Client, names: &[String], recursive: bool) -> Result<Vec<String>, String> {
    let (given, recursive) = if names.is_empty() { (pool_names(c).await?, true) } else { (names.to_vec(), recursive) };
    let mut out = vec![];
    for n in given {
        let is_pool = !n.contains('/');
        out.push(n.clone());
        if is_pool && recursive {
            out.extend(volumes_of(c, Some(&n)).await?);
        }
    }
    Ok(out)
}

/// The source classes of `-s`.
fn source_class(source: &str) -> &str {
    match source {
        "-" => "none",
        s if s.starts_with("inherited") => "inherited",
        s => s,
    }
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',').map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect()
}

/// `zilla get [-Hpr] [-o FIELDS] [-s SOURCES] PROPS [NAME]...`
pub async fn get(c: &Client, a: GetArgs) -> Result<(), String> {
    let fields = split_list(a.fields.as_deref().unwrap_or("name,property,value,source"));
    if let Some(bad) = fields.iter().find(|f| !["name", "property", "value", "received", "source"].contains(&f.as_str())) {
        return Err(format!("invalid field '{bad}' (fields are name, property, value, received, source)"));
    }
    let sources = a.sources.as_deref().map(split_list);
    if let Some(bad) = sources.iter().flatten().find(|s| !["local", "default", "inherited", "temporary", "received", "none"].contains(&s.as_str())) {
        return Err(format!("invalid source '{bad}' (sources are local, default, inherited, temporary, received, none)"));
    }
    let wanted: Vec<String> = split_list(&a.props).iter().map(|p| canonical(p).to_string()).collect();
    let all = wanted.is_empty() || wanted.iter().any(|p| p == "all");
    let mut datasets = vec![];
    for n in get_names(c, &a.names, a.recursive).await? {
        datasets.push(Dataset::fetch(c, &n).await?);
    }
    if !all {
        if let Some(bad) = wanted.iter().find(|p| !volume_property(p) && !datasets.iter().any(|d| d.knows(p))) {
            return Err(format!("unknown property '{bad}'"));
        }
    }
    let mut rows: Vec<PropRow> = vec![];
    for d in &datasets {
        if all {
            rows.extend(d.rows.iter().filter(|r| r.property != "name" && r.property != "mountpoint").cloned());
        } else {
            rows.extend(wanted.iter().map(|p| d.row(p)));
        }
    }
    rows.retain(|r| sources.as_ref().is_none_or(|s| s.iter().any(|s| s == source_class(&r.source))));
    print!("{}", get_table(&rows, &fields, a.scripted, a.parsable));
    Ok(())
}

fn get_table(rows: &[PropRow], fields: &[String], scripted: bool, parsable: bool) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            fields
                .iter()
                .map(|f| match f.as_str() {
                    "name" => r.name.clone(),
                    "property" => r.property.clone(),
                    "value" => prop_value(&r.property, &r.value, parsable),
                    "source" => r.source.clone(),
                    _ => "-".into(), // received: nothing is received here
                })
                .collect()
        })
        .collect();
    let headers: Vec<String> = fields.iter().map(|f| f.to_ascii_uppercase()).collect();
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut out = table(&headers, &vec![Align::Left; fields.len()], &cells, scripted);
    if !scripted {
        let noted: std::collections::BTreeSet<(&str, &str)> = rows.iter().filter_map(|r| Some((r.property.as_str(), r.note.as_deref()?))).collect();
        for (property, note) in noted {
            out += &format!("note: {property} is stored but has no effect yet: {note}\n");
        }
    }
    out
}

/// The types `list -t` asks for include volumes (the only datasets there are).
fn lists_volumes(types: Option<&str>) -> Result<bool, String> {
    let mut volumes = types.is_none();
    for t in split_list(types.unwrap_or("")) {
        match t.as_str() {
            "volume" | "vol" | "all" => volumes = true,
            "filesystem" | "fs" | "snapshot" | "snap" | "bookmark" => {}
            _ => return Err(format!("invalid type '{t}' (types are filesystem, volume, snapshot, bookmark, all)")),
        }
    }
    Ok(volumes)
}

/// `zilla list [-Hpr] [-o PROPS] [-t TYPES] [-s PROP] [-S PROP] [NAME]...`
pub async fn list(c: &Client, a: ListArgs) -> Result<(), String> {
    let props: Vec<String> = split_list(a.props.as_deref().unwrap_or("name,used,available,referenced,mountpoint")).iter().map(|p| canonical(p).to_string()).collect();
    let sorts: Vec<(String, bool)> =
        a.sort_ascending.iter().map(|p| (canonical(p).to_string(), false)).chain(a.sort_descending.iter().map(|p| (canonical(p).to_string(), true))).collect();
    if let Some(bad) = props.iter().chain(sorts.iter().map(|(p, _)| p)).find(|p| !volume_property(p)) {
        return Err(format!("invalid property '{bad}'"));
    }
    // -r: a pool named stands for its volumes anyway, and volumes have no children
    let _ = a.recursive;
    let mut names = vec![];
    if a.names.is_empty() {
        names = volumes_of(c, None).await?;
    }
    for n in &a.names {
        if n.contains('/') {
            names.push(n.clone());
        } else {
            names.extend(volumes_of(c, Some(n)).await?);
        }
    }
    let mut datasets = vec![];
    if lists_volumes(a.types.as_deref())? {
        for n in names {
            datasets.push(Dataset::fetch(c, &n).await?);
        }
    }
    if datasets.is_empty() {
        eprintln!("no datasets available");
        return Ok(());
    }
    sort_datasets(&mut datasets, &sorts);
    let cells: Vec<Vec<String>> = datasets.iter().map(|d| props.iter().map(|p| prop_value(p, &d.row(p).value, a.parsable)).collect()).collect();
    let headers: Vec<String> = props.iter().map(|p| header(p)).collect();
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    let align: Vec<Align> = props.iter().map(|p| if crate::format::is_numeric_prop(p) { Align::Right } else { Align::Left }).collect();
    print!("{}", table(&headers, &align, &cells, a.scripted));
    Ok(())
}

/// Sort by the `-s`/`-S` properties in turn (numbers as numbers), then by name.
fn sort_datasets(datasets: &mut [Dataset], sorts: &[(String, bool)]) {
    datasets.sort_by(|x, y| {
        for (p, descending) in sorts {
            let (a, b) = (x.row(p).value, y.row(p).value);
            let order = match (a.parse::<f64>(), b.parse::<f64>()) {
                (Ok(a), Ok(b)) => a.partial_cmp(&b).unwrap_or(std::cmp::Ordering::Equal),
                _ => a.cmp(&b),
            };
            let order = if *descending { order.reverse() } else { order };
            if order.is_ne() {
                return order;
            }
        }
        x.name.cmp(&y.name)
    });
}
