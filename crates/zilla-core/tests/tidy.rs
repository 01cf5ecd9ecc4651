//! tidy: structural rules every crate of the workspace keeps, checked in the default
//! test run.
//!
//! Theory of operation
//! -------------------
//! The checks read the sources, not the compiler's view: each `.rs` file under
//! `crates/*/src` is reduced to code (comments, string and char literals blanked,
//! newlines kept so line numbers hold; `#[cfg(test)] mod` blocks dropped), then
//!
//! * layering: every `crate::x` path (in `use` items, `{a, b}` groups included, and in
//!   code) gives an edge from the file's top-level module to `x`. In zilla-core an edge
//!   must point to a lower row of `zilla_core::LAYERS`; an edge sideways within a row or
//!   upward is a violation. In every crate the module graph must have no cycles (every
//!   edge inside a strongly connected component is a violation; in zilla-core, where
//!   every module has a row, a cycle always shows as a non-downward edge). The crate
//!   root is the assembly point and exempt.
//! * function length: no function body over `MAX_FN_LINES` lines (signature line to
//!   closing brace).
//! * the Env's clock: a zilla-core module in a row of `zilla_core::LAYERS` below spa's
//!   (or in no row yet) does not read the OS clock, sleep or wait with a timeout of its
//!   own (`CLOCK_CALLS`); time comes from the pool's `Env`, so a test can drive it.
//!   `env` is where those calls live. No allow-list: there is no violation today.
//!
//! The first two checks are ratchets over a checked-in allow-list of today's violations
//! (`tests/tidy/layering-allow.txt`, `tests/tidy/long-functions.txt`): a violation not
//! listed fails, a listed function that grew fails, and an entry that no longer matches
//! a violation fails too, so the lists can only shrink.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FN_LINES: usize = 70;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn allow_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tidy").join(name)
}

/// One source file of a crate, reduced to code.
struct Source {
    krate: String,
    /// Path relative to the workspace root.
    path: String,
    /// Top-level module ("" for the crate root).
    module: String,
    code: String,
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn sources() -> Vec<Source> {
    let root = workspace_root();
    let mut out = Vec::new();
    let mut crates: Vec<_> = std::fs::read_dir(root.join("crates")).unwrap().map(|e| e.unwrap().path()).collect();
    crates.sort();
    for dir in crates.into_iter().filter(|d| d.join("src").is_dir()) {
        let krate = dir.file_name().unwrap().to_string_lossy().into_owned();
        let mut files = Vec::new();
        rs_files(&dir.join("src"), &mut files);
        for f in files {
            let rel = f.strip_prefix(dir.join("src")).unwrap();
            let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
            let first = first.trim_end_matches(".rs").to_string();
            let module = if rel.components().count() == 1 && (first == "lib" || first == "main") { String::new() } else { first };
            let text = std::fs::read_to_string(&f).unwrap();
            let path = f.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
            out.push(Source { krate: krate.clone(), path, module, code: drop_test_modules(&blank_non_code(&text)) });
        }
    }
    out
}

/// Comments, string literals (plain, byte, raw) and char literals become spaces;
/// newlines stay.
fn blank_non_code(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied().unwrap_or('\0');
        if c == '/' && next == '/' {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == '*' {
            let mut depth = 0;
            loop {
                if i >= b.len() {
                    break;
                }
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == '"' || next == '#') && raw_prefix_ok(&b, i) && raw_string_at(&b, i).is_some() {
            let end = raw_string_at(&b, i).unwrap();
            out.push('"');
            out.extend(b[i + 1..end - 1].iter().map(|&c| blank(c)));
            out.push('"');
            i = end;
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c == '\'' && char_literal_len(&b, i) > 0 {
            let n = char_literal_len(&b, i);
            out.push_str(&" ".repeat(n));
            i += n;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn prev_is_ident(b: &[char], i: usize) -> bool {
    i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_')
}

/// The `r` at `i` starts a raw string: not part of an identifier (`br` is fine).
fn raw_prefix_ok(b: &[char], i: usize) -> bool {
    !prev_is_ident(b, i) || (b[i - 1] == 'b' && !prev_is_ident(b, i - 1))
}

/// `r"..."` / `r#"..."#` starting at `i`: index just past its end.
fn raw_string_at(b: &[char], i: usize) -> Option<usize> {
    let mut j = i + 1;
    let mut hashes = 0;
    while b.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if b.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < b.len() {
        if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(b.len())
}

/// Length of a char literal at `i` ('a', '\n', '\u{1F600}', '\''), 0 for a lifetime.
fn char_literal_len(b: &[char], i: usize) -> usize {
    match (b.get(i + 1), b.get(i + 2)) {
        (Some('\\'), _) => {
            let mut j = i + 2;
            while j < i + 12 {
                j += 1;
                if b.get(j) == Some(&'\'') {
                    return j + 1 - i;
                }
            }
            0
        }
        (Some(_), Some('\'')) => 3,
        _ => 0,
    }
}

/// Index of the brace matching the `{` at `open`.
fn matching_brace(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, &c) in code.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    code.len().saturating_sub(1)
}

/// `#[cfg(test)] mod x { .. }` blocks become blank (newlines kept).
fn drop_test_modules(code: &str) -> String {
    let mut out: Vec<u8> = code.as_bytes().to_vec();
    let mut from = 0;
    while let Some(pos) = code[from..].find("#[cfg(test)]") {
        let at = from + pos;
        from = at + 1;
        let rest = code[at + 12..].trim_start();
        let Some(after_mod) = rest.strip_prefix("mod ") else { continue };
        let Some(brace_rel) = after_mod.find(['{', ';']) else { continue };
        if after_mod.as_bytes()[brace_rel] == b';' {
            continue;
        }
        let open = code.len() - after_mod.len() + brace_rel;
        let close = matching_brace(code.as_bytes(), open);
        for c in &mut out[at..=close] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    }
    String::from_utf8(out).unwrap()
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Top-level module names a source refers to through `crate::` paths.
fn crate_refs(code: &str) -> BTreeSet<String> {
    let b = code.as_bytes();
    let mut refs = BTreeSet::new();
    let mut from = 0;
    while let Some(pos) = code[from..].find("crate::") {
        let at = from + pos;
        from = at + 7;
        if at > 0 && (is_ident(b[at - 1]) || b[at - 1] == b'$') {
            continue; // e.g. zilla_core::..., $crate::
        }
        let rest = code[at + 7..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // top-level items of a use group: split at depth-0 commas
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        refs.insert(first_ident(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            refs.insert(first_ident(&item));
        } else {
            refs.insert(first_ident(rest));
        }
    }
    refs.remove("");
    refs.remove("self");
    refs
}

fn first_ident(s: &str) -> String {
    s.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// Edges between top-level modules, per crate: (crate, from) -> {to}. Names that are
/// not modules of the crate (re-exported items such as `crate::Error`) map to the module
/// that defines them when `reexports` says so, else they are dropped.
fn module_graph(srcs: &[Source]) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut modules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in srcs.iter().filter(|s| !s.module.is_empty()) {
        modules.entry(s.krate.clone()).or_default().insert(s.module.clone());
    }
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for s in srcs.iter().filter(|s| !s.module.is_empty()) {
        let mods = &modules[&s.krate];
        let root_reexports = reexports(srcs, &s.krate);
        for r in crate_refs(&s.code) {
            let target = if mods.contains(&r) { Some(r) } else { root_reexports.get(&r).cloned() };
            if let Some(t) = target.filter(|t| *t != s.module) {
                graph.entry(s.krate.clone()).or_default().entry(s.module.clone()).or_default().insert(t);
            }
        }
    }
    graph
}

/// `pub use module::{A, B}` items of a crate root: item name -> module.
fn reexports(srcs: &[Source], krate: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for s in srcs.iter().filter(|s| s.krate == krate && s.module.is_empty()) {
        for line in s.code.lines() {
            let Some(rest) = line.trim().strip_prefix("pub use ") else { continue };
            let Some((module, items)) = rest.split_once("::") else { continue };
            let items = items.trim_end_matches(';').trim_start_matches('{').trim_end_matches('}');
            for item in items.split(',') {
                let name = item.split(" as ").last().unwrap_or("").trim();
                if !name.is_empty() {
                    m.insert(name.to_string(), module.trim().to_string());
                }
            }
        }
    }
    m
}

/// Edges that lie on a cycle: u -> v where v reaches u.
fn cycle_edges(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<(String, String)> {
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(n) = stack.pop() {
            if n == to {
                return true;
            }
            if seen.insert(n.clone()) {
                stack.extend(edges.get(&n).into_iter().flatten().cloned());
            }
        }
        false
    };
    let mut out = BTreeSet::new();
    for (u, vs) in edges {
        for v in vs {
            if reaches(v, u) {
                out.insert((u.clone(), v.clone()));
            }
        }
    }
    out
}

fn layer_of(module: &str) -> Option<usize> {
    zilla_core::LAYERS.iter().position(|row| row.contains(&module))
}

/// Every layering violation as an allow-list line: "crate from -> to (why)".
fn layering_violations(srcs: &[Source]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let graph = module_graph(srcs);
    for (krate, edges) in &graph {
        if krate != "zilla-core" {
            for (u, v) in cycle_edges(edges) {
                out.insert(format!("{krate} {u} -> {v} (cycle)"));
            }
            continue;
        }
        // every engine module has a row, so any cycle contains an edge that is not
        // downward: the row check below reports it
        for (u, vs) in edges {
            for v in vs {
                let (Some(lu), Some(lv)) = (layer_of(u), layer_of(v)) else { continue };
                if lv > lu {
                    out.insert(format!("{krate} {u} -> {v} (upward)"));
                } else if lv == lu {
                    out.insert(format!("{krate} {u} -> {v} (sideways)"));
                }
            }
        }
    }
    out
}

fn read_allow(name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(allow_file(name)).unwrap_or_default();
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}

#[test]
fn layer_table_names_every_engine_module() {
    let srcs = sources();
    let present: BTreeSet<&str> =
        srcs.iter().filter(|s| s.krate == "zilla-core" && !s.module.is_empty()).map(|s| s.module.as_str()).collect();
    let listed: BTreeSet<&str> = zilla_core::LAYERS.iter().flat_map(|r| r.iter().copied()).collect();
    let unplaced: Vec<_> = present.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&present).collect();
    assert!(unplaced.is_empty(), "modules missing from zilla_core::LAYERS (crates/zilla-core/src/lib.rs): {unplaced:?}");
    assert!(stale.is_empty(), "zilla_core::LAYERS lists modules that do not exist: {stale:?}");
}

#[test]
fn imports_point_down_and_no_cycles() {
    let found = layering_violations(&sources());
    let allowed: BTreeSet<String> = read_allow("layering-allow.txt").into_iter().collect();
    let new: Vec<_> = found.difference(&allowed).collect();
    let fixed: Vec<_> = allowed.difference(&found).collect();
    let mut msg = String::new();
    for v in &new {
        msg += &format!("layering violation: {v}\n");
    }
    for v in &fixed {
        msg += &format!("no longer a violation, remove it from crates/zilla-core/tests/tidy/layering-allow.txt: {v}\n");
    }
    assert!(msg.is_empty(), "\n{msg}(rows of zilla_core::LAYERS, bottom first: {:?})", zilla_core::LAYERS);
}

/// (crate, function name, lines) of every function longer than MAX_FN_LINES.
fn long_functions(srcs: &[Source]) -> Vec<(String, String, String, usize)> {
    let mut out = Vec::new();
    for s in srcs {
        let code = s.code.as_bytes();
        let mut from = 0;
        while let Some(pos) = s.code[from..].find("fn ") {
            let at = from + pos;
            from = at + 3;
            if at > 0 && is_ident(code[at - 1]) {
                continue;
            }
            let name = first_ident(&s.code[at + 3..]);
            if name.is_empty() {
                continue;
            }
            let Some(open) = body_start(code, at + 3) else { continue };
            let close = matching_brace(code, open);
            let line = |k: usize| code[..k].iter().filter(|&&c| c == b'\n').count();
            let lines = line(close) - line(at) + 1;
            if lines > MAX_FN_LINES {
                out.push((s.krate.clone(), name, s.path.clone(), lines));
            }
        }
    }
    out
}

/// The `{` opening a function body, or None for a declaration without one.
fn body_start(code: &[u8], from: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (k, &c) in code.iter().enumerate().skip(from) {
        match c {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b'{' if depth == 0 => return Some(k),
            b';' if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

#[test]
fn function_length_ratchet() {
    // allow-list lines: "crate function lines"; one line per long function
    let mut allowed: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for l in read_allow("long-functions.txt") {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert!(f.len() >= 3, "bad line in long-functions.txt: {l}");
        allowed.entry((f[0].into(), f[1].into())).or_default().push(f[2].parse().expect("line count"));
    }
    let mut found: BTreeMap<(String, String), Vec<(usize, String)>> = BTreeMap::new();
    for (k, name, path, lines) in long_functions(&sources()) {
        found.entry((k, name)).or_default().push((lines, path));
    }
    let mut msg = String::new();
    let keys: BTreeSet<_> = allowed.keys().chain(found.keys()).cloned().collect();
    for key in keys {
        let mut have = found.get(&key).cloned().unwrap_or_default();
        let mut may = allowed.get(&key).cloned().unwrap_or_default();
        have.sort_by(|a, b| b.cmp(a));
        may.sort_by(|a, b| b.cmp(a));
        for (i, (lines, path)) in have.iter().enumerate() {
            match may.get(i) {
                None => msg += &format!("{path}: fn {} is {lines} lines (limit {MAX_FN_LINES}): split it\n", key.1),
                Some(&m) if *lines > m => msg += &format!("{path}: fn {} grew to {lines} lines (allow-list: {m}): shrink it\n", key.1),
                Some(&m) if *lines < m => msg += &format!("{path}: fn {} shrank to {lines} lines: lower its entry from {m} (the list only shrinks)\n", key.1),
                _ => {}
            }
        }
        for m in may.iter().skip(have.len()) {
            msg += &format!("{} fn {} ({m} lines) is no longer over {MAX_FN_LINES}: remove its line\n", key.0, key.1);
        }
    }
    assert!(msg.is_empty(), "\nfunction length ratchet (crates/zilla-core/tests/tidy/long-functions.txt):\n{msg}");
}

#[test]
fn the_parser_sees_what_it_should() {
    let code = blank_non_code("use crate::{a::b, c, d::{e, f}}; // crate::zz\nlet s = \"crate::yy\"; let c = '{'; fn x<'a>() {}\n");
    let refs = crate_refs(&code);
    assert_eq!(refs.into_iter().collect::<Vec<_>>(), ["a", "c", "d"]);
    assert_eq!(code.lines().count(), 2);
    let code = drop_test_modules("fn a() { crate::x::y(); }\n#[cfg(test)]\nmod tests { use crate::z; }\n");
    assert_eq!(crate_refs(&code).into_iter().collect::<Vec<_>>(), ["x"]);
    let mut edges = BTreeMap::new();
    edges.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    edges.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    edges.insert("c".to_string(), BTreeSet::from(["a".to_string(), "d".to_string()]));
    assert_eq!(cycle_edges(&edges).len(), 3, "a->b->c->a is a cycle, c->d is not");
}

/// What reads the OS clock, sleeps or waits with a timeout without the Env (matched in
/// code with its blanks removed): `Instant::now`, `SystemTime::now`, thread sleeps,
/// tokio's timers, and timed waits on condvars, channels and parked threads.
const CLOCK_CALLS: &[&str] =
    &["Instant::now", "SystemTime::now", "thread::sleep", "tokio::time", ".wait_for(", ".wait_until(", ".wait_timeout", "recv_timeout(", "recv_deadline(", "park_timeout("];

/// The one module below spa that may make them.
const CLOCK_MODULE: &str = "env";

/// Must `module` of zilla-core take its time from the Env: a row below spa's, or no row
/// yet (a module just added; `layer_table_names_every_engine_module` asks for its row).
fn takes_time_from_env(module: &str) -> bool {
    let spa = layer_of("spa").expect("spa has a row");
    !module.is_empty() && module != CLOCK_MODULE && layer_of(module).is_none_or(|row| row < spa)
}

/// "path:line: call" for every clock call in a zilla-core module that takes its time
/// from the Env. Comments, string literals and `#[cfg(test)]` modules (tests may sleep)
/// are not code here.
fn clock_calls(srcs: &[Source]) -> Vec<String> {
    let mut out = Vec::new();
    for s in srcs.iter().filter(|s| s.krate == "zilla-core" && takes_time_from_env(&s.module)) {
        for (n, line) in s.code.lines().enumerate() {
            let squeezed: String = line.split_whitespace().collect();
            for call in CLOCK_CALLS.iter().filter(|c| squeezed.contains(*c)) {
                out.push(format!("{}:{}: {}", s.path, n + 1, call.trim_matches(|c| c == '.' || c == '(')));
            }
        }
    }
    out
}

#[test]
fn below_spa_time_comes_from_the_env() {
    let found = clock_calls(&sources());
    assert!(
        found.is_empty(),
        "\nclock calls below spa (read the pool's Env instead: `now_ns`, `sleep_ns`/`sleep_until_ns`, \
         `env::wait_until`/`env::wait_ns` for timed condvar waits, `env::Clock` on a hot path):\n{}\n",
        found.join("\n")
    );
}

#[test]
fn the_clock_rule_sees_what_it_should() {
    let src = |module: &str, text: &str| Source {
        krate: "zilla-core".into(),
        path: format!("crates/zilla-core/src/{module}.rs"),
        module: module.into(),
        code: drop_test_modules(&blank_non_code(text)),
    };
    let calls = |module: &str, text: &str| clock_calls(&[src(module, text)]);
    // each call, in a module of every row below spa, and in a module with no row yet
    let text = "fn f(cv: &Condvar, g: &mut G) {\n let t = std::time::Instant::now();\n std::thread::sleep(d);\n \
                let w = SystemTime::now();\n cv.wait_for(g, d);\n cv\n   .wait_until(g, t);\n rx.recv_timeout(d);\n \
                tokio::time::sleep(d);\n thread :: sleep(d);\n}\n";
    for module in ["zil", "txg", "vdev", "zvol", "memvol", "kstat", "a_new_module"] {
        let found = calls(module, text);
        assert_eq!(found.len(), 8, "{module}: {found:?}");
        assert_eq!(found[0], format!("crates/zilla-core/src/{module}.rs:2: Instant::now"));
    }
    assert_eq!(calls("zil", "use std::time::Instant;\nfn f() { let t = Instant::now(); }\n"), ["crates/zilla-core/src/zil.rs:2: Instant::now"]);
    // the Env itself, spa and the crate root may
    for module in ["env", "spa", ""] {
        assert!(calls(module, text).is_empty(), "{module}");
    }
    // comments, strings, test modules and the Env's own calls are fine
    let fine = "// std::thread::sleep(d)\n/* Instant::now() */\nfn f(env: &dyn Env) {\n let s = \"thread::sleep\";\n \
                env.sleep_ns(5);\n env::wait_until(env, cv, g, d);\n self.wait_for_sync_work(a, b);\n}\n\
                #[cfg(test)]\nmod tests {\n fn t() { std::thread::sleep(d); let t = Instant::now(); }\n}\n";
    assert_eq!(calls("zil", fine), Vec::<String>::new());
}

/// The names of the tunables declared in `text` (`Tunable::new("name", ..)`,
/// `new_choice`, `new_auto`), test modules left out.
fn declared_tunables(text: &str) -> Vec<String> {
    let text = drop_test_modules(text);
    let mut out = Vec::new();
    for (at, _) in text.match_indices("Tunable::new") {
        let rest = &text[at..];
        let Some(open) = rest.find('(') else { continue };
        if let Some(quoted) = rest[open + 1..].trim_start().strip_prefix('"') {
            out.push(quoted[..quoted.find('"').unwrap_or(0)].to_string());
        }
    }
    out
}

/// Each module owns its tunables as statics; the registry the admin API reads
/// (`zilla_core::tunables()`, one list at the crate root, so `kstat` imports no
/// module) must hold every one of them: a static left out of it could never be read or
/// set with `zilla tunable`.
#[test]
fn every_declared_tunable_is_registered() {
    let mut files = Vec::new();
    rs_files(&workspace_root().join("crates/zilla-core/src"), &mut files);
    let declared: BTreeSet<String> = files.iter().flat_map(|f| declared_tunables(&std::fs::read_to_string(f).unwrap())).collect();
    let registered: BTreeSet<String> = zilla_core::tunables().list().iter().map(|t| t.name.to_string()).collect();
    assert!(declared.len() > 50 && declared.contains("zfs_txg_timeout"), "the scan found too few: {declared:?}");
    let missing: Vec<&String> = declared.difference(&registered).collect();
    assert!(missing.is_empty(), "declared but not in zilla_core::TUNABLES (lib.rs): {missing:?}");
    assert_eq!(declared_tunables("static X: Tunable = Tunable::new_auto(\n  \"x_y\", 1);"), vec!["x_y"]);
}

/// The names in the `[dependencies]` table of a Cargo.toml (not dev-dependencies).
fn normal_dependencies(manifest: &str) -> BTreeSet<String> {
    let mut in_table = false;
    let mut names = BTreeSet::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_table = line == "[dependencies]";
        } else if in_table && !line.is_empty() && !line.starts_with('#') {
            names.insert(line.split(['=', '.', ' ']).next().unwrap_or("").to_string());
        }
    }
    names
}

/// Protocol crates (every crate that depends on zilla-frontend, but the daemon that
/// assembles everything) reach volumes only through zilla-frontend's request path and
/// contract: zilla-core is not among their dependencies and their code does not name it.
#[test]
fn protocol_crates_see_the_engine_only_through_the_front_end() {
    let manifest = "[package]\nname = \"x\"\n[dependencies]\nzilla-frontend.workspace = true\nzilla-core = { path = \"..\" }\n[dev-dependencies]\nrand = \"1\"\n";
    assert_eq!(normal_dependencies(manifest), ["zilla-core", "zilla-frontend"].map(String::from).into());
    let srcs = sources();
    let mut protocols = Vec::new();
    let mut msg = String::new();
    for dir in std::fs::read_dir(workspace_root().join("crates")).unwrap().map(|e| e.unwrap().path()) {
        let krate = dir.file_name().unwrap().to_string_lossy().into_owned();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else { continue };
        let deps = normal_dependencies(&manifest);
        if krate == "zilla" || krate == "zilla-frontend" || !deps.contains("zilla-frontend") {
            continue;
        }
        protocols.push(krate.clone());
        if deps.contains("zilla-core") {
            msg += &format!("{krate}: depends on zilla-core; use zilla_frontend (its executor and `volume` module)\n");
        }
        for src in srcs.iter().filter(|s| s.krate == krate && s.code.contains("zilla_core")) {
            msg += &format!("{}: names zilla_core; use zilla_frontend\n", src.path);
        }
    }
    assert!(protocols.contains(&"zilla-nbd".to_string()), "found protocol crates: {protocols:?}");
    assert!(msg.is_empty(), "{msg}");
}
