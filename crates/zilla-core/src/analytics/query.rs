//! Queries over a dataset's history, and the live stream's last point, in the API's
//! JSON shapes.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::buckets::BUCKETS;
use super::catalog::{DatasetId, Kind, OTHER_KEY};
use super::history::{History, Point, QuerySeries, SparseBuckets};
use super::{AnalyticsError, Store};

/// Most points one answer holds.
pub const QUERY_POINTS_MAX: u64 = 3600;
/// Most keys one answer holds (the busiest), the rest summed into `other`; also the
/// most keys a filter may name.
pub const QUERY_KEYS_MAX: usize = 64;
/// The range when none is given: the last five minutes.
const DEFAULT_RANGE_S: u64 = 300;

/// A query (`GET /api/v1/analytics/query`): None takes the default.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub dataset: String,
    /// Unix s; default `to` - 300.
    pub from: Option<u64>,
    /// Unix s; default now.
    pub to: Option<u64>,
    /// 1 or 60; default 1 when `from` is within the last hour and the range fits
    /// [`QUERY_POINTS_MAX`] seconds, else 60.
    pub resolution: Option<u64>,
    /// Only these keys (empty: all).
    pub filter: Vec<String>,
}

/// The answer to a query.
#[derive(Debug, Clone, Serialize)]
pub struct QueryAnswer {
    pub dataset: String,
    pub kind: Kind,
    pub unit: &'static str,
    pub resolution: u64,
    pub from: u64,
    pub to: u64,
    /// The end of each interval (unix s), every `resolution` seconds, no holes.
    pub times: Vec<u64>,
    pub series: Vec<QuerySeries>,
}

/// One key of the live stream's point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveSeries {
    pub key: String,
    /// Counter: events (or bytes) per second; histogram: events in the second.
    pub value: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buckets: Option<SparseBuckets>,
}

/// One dataset's last second, as the live stream sends it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveDataset {
    pub series: Vec<LiveSeries>,
}

impl Store {
    /// Answer a query (see [`Query`] for the defaults). A disabled dataset answers
    /// with nothing collected (null everywhere).
    pub fn query(&self, q: &Query) -> Result<QueryAnswer, AnalyticsError> {
        let id = DatasetId::parse(&q.dataset).ok_or_else(|| AnalyticsError::UnknownDataset(q.dataset.clone()))?;
        let (from, to, step) = self.resolve_range(q)?;
        // distinct keys in order, refused as soon as there are too many (a filter of
        // 10,000 keys costs one pass, not a comparison of every pair)
        let mut filter: Vec<&str> = Vec::new();
        let mut seen: HashSet<&str> = HashSet::new();
        for k in &q.filter {
            if seen.insert(k.as_str()) {
                filter.push(k);
            }
            if filter.len() > QUERY_KEYS_MAX {
                return Err(AnalyticsError::BadQuery(format!("the filter names more than {QUERY_KEYS_MAX} keys; the limit is {QUERY_KEYS_MAX}")));
            }
        }
        // a point's time is the end of its interval (t - step, t]: the points that
        // overlap (from, to], the minute being summed at `to` included
        let first = (from / step + 1).saturating_mul(step);
        let last = to.div_ceil(step).saturating_mul(step);
        let times: Vec<u64> = (first..=last).step_by(step as usize).collect();
        let series = match self.histories.get(&id) {
            Some(h) => build_series(h, &times, step, &filter),
            None => filter.iter().map(|k| empty_series(k, id.kind(), times.len())).collect(),
        };
        Ok(QueryAnswer { dataset: id.name(), kind: id.kind(), unit: id.statistic().unit, resolution: step, from, to, times, series })
    }

    /// (from, to, resolution) of a query, defaults applied and checked.
    fn resolve_range(&self, q: &Query) -> Result<(u64, u64, u64), AnalyticsError> {
        let now = self.now_unix_s();
        let to = q.to.unwrap_or(now);
        let from = q.from.unwrap_or(to.saturating_sub(DEFAULT_RANGE_S));
        if from >= to {
            return Err(AnalyticsError::BadQuery(format!("from ({from}) must be before to ({to})")));
        }
        let per_second = from >= now.saturating_sub(3600) && to - from <= QUERY_POINTS_MAX;
        let step = q.resolution.unwrap_or(if per_second { 1 } else { 60 });
        if step != 1 && step != 60 {
            return Err(AnalyticsError::BadQuery(format!("resolution {step}: it is 1 or 60 (seconds)")));
        }
        let points = to.div_ceil(step) - from / step;
        if points > QUERY_POINTS_MAX {
            return Err(AnalyticsError::BadQuery(format!(
                "{from}..{to} at resolution {step} is {points} points; the limit is {QUERY_POINTS_MAX} (narrow the range or use resolution 60)"
            )));
        }
        Ok((from, to, step))
    }

    /// The dataset's point at the last second ingested, and that second (unix s);
    /// None when it has no point there (a hole, or nothing ingested yet).
    pub fn latest(&self, dataset: &str) -> Result<Option<(u64, LiveDataset)>, AnalyticsError> {
        let id = DatasetId::parse(dataset).ok_or_else(|| AnalyticsError::UnknownDataset(dataset.to_string()))?;
        let (Some(h), Some(time)) = (self.histories.get(&id), self.last_unix_s) else { return Ok(None) };
        let Some(point) = h.point(time, 1) else { return Ok(None) };
        let mut series: Vec<LiveSeries> = point
            .series
            .iter()
            .map(|s| LiveSeries {
                key: h.key_name(s.key).to_string(),
                value: s.value,
                buckets: (id.kind() == Kind::Histogram).then(|| s.pairs()),
            })
            .collect();
        series.sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.key.cmp(&b.key)));
        Ok(Some((time, LiveDataset { series })))
    }
}

fn empty_series(key: &str, kind: Kind, n: usize) -> QuerySeries {
    QuerySeries { key: key.to_string(), values: vec![None; n], buckets: (kind == Kind::Histogram).then(|| vec![None; n]) }
}

/// Does `key` match `pattern`, where `*` stands for any text (`tank/v1:*`)?
pub fn glob_match(pattern: &str, key: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return pattern == key;
    }
    if key.len() < first.len() + last.len() || !key.starts_with(first) || !key.ends_with(last) {
        return false;
    }
    let mut rest = &key[first.len()..key.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// The keys an answer shows and the series each stored key adds into: the filter's
/// keys (a key with `*` stands for every stored key it matches, busiest first, up to
/// `QUERY_KEYS_MAX` in all), or the busiest `QUERY_KEYS_MAX` with the rest in `other`.
fn choose_keys(points: &[Option<Point>], h: &History, filter: &[&str]) -> (Vec<String>, HashMap<String, usize>) {
    let mut totals: HashMap<&str, u64> = HashMap::new();
    for s in points.iter().flatten().flat_map(|p| &p.series) {
        *totals.entry(h.key_name(s.key)).or_default() += s.value;
    }
    let mut keys: Vec<(&str, u64)> = totals.into_iter().collect();
    keys.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    if !filter.is_empty() {
        let mut names: Vec<String> = filter.iter().filter(|k| !k.contains('*')).map(|k| k.to_string()).collect();
        let patterns: Vec<&str> = filter.iter().copied().filter(|k| k.contains('*')).collect();
        for (k, _) in &keys {
            if names.len() < QUERY_KEYS_MAX && patterns.iter().any(|p| glob_match(p, k)) && !names.iter().any(|n| n == k) {
                names.push(k.to_string());
            }
        }
        let route = names.iter().enumerate().map(|(i, k)| (k.clone(), i)).collect();
        return (names, route);
    }
    let mut names: Vec<String> = Vec::new();
    let mut route = HashMap::new();
    let mut other: Option<usize> = None;
    for (i, (k, _)) in keys.iter().enumerate() {
        let idx = if i >= QUERY_KEYS_MAX || *k == OTHER_KEY {
            *other.get_or_insert_with(|| {
                names.push(OTHER_KEY.to_string());
                names.len() - 1
            })
        } else {
            names.push(k.to_string());
            names.len() - 1
        };
        route.insert(k.to_string(), idx);
    }
    (names, route)
}

fn build_series(h: &History, times: &[u64], step: u64, filter: &[&str]) -> Vec<QuerySeries> {
    let kind = h.id.kind();
    let points: Vec<Option<Point>> = times.iter().map(|t| h.point(*t, step)).collect();
    let (names, route) = choose_keys(&points, h, filter);
    let mut out: Vec<QuerySeries> = names.iter().map(|k| empty_series(k, kind, times.len())).collect();
    let mut sums = vec![(0u64, vec![0u64; if kind == Kind::Histogram { BUCKETS } else { 0 }]); names.len()];
    for (i, p) in points.iter().enumerate() {
        let Some(p) = p else { continue };
        sums.iter_mut().for_each(|(v, b)| {
            *v = 0;
            b.iter_mut().for_each(|c| *c = 0);
        });
        for s in &p.series {
            let Some(&idx) = route.get(h.key_name(s.key)) else { continue };
            sums[idx].0 += s.value;
            for (a, c) in sums[idx].1.iter_mut().zip(&s.buckets) {
                *a += *c as u64;
            }
        }
        for (series, (v, b)) in out.iter_mut().zip(&sums) {
            series.values[i] = Some(*v as f64 / p.seconds as f64);
            if let Some(buckets) = series.buckets.as_mut() {
                buckets[i] = Some(b.iter().enumerate().filter(|(_, c)| **c > 0).map(|(k, c)| (k as u8, *c)).collect());
            }
        }
    }
    out
}
