//! The in-cluster pieces exist twice: as the Helm chart `charts/oxide-controller/` and as the
//! plain manifests `k8s-cronjobs/` that `kubectl apply -f` takes and `bootstrap` embeds. These
//! tests hold the two together and hold both to the security and scheduling rules of the
//! design, with nothing but cargo: Helm is not needed, because the chart's templates keep to a
//! small Go-template subset that [`render_chart`] implements (value and Chart field
//! references, `toYaml … | nindent N`, `.Files.Get`, `.Capabilities.APIVersions.Has` with the
//! versions `--api-versions` would give, comments) and reject everything else.
//!
//! The monitoring objects (ServiceMonitor, PrometheusRule, the Grafana dashboard) render only
//! where the cluster serves `monitoring.coreos.com/v1`, so not at the defaults the drift check
//! compares; their own tests render them with that API declared.
//!
//! The drift check renders the chart at its default values, parses both sides, normalizes
//! them (nulls, empty maps and empty lists are dropped: Helm renders an empty `nodeSelector`
//! that a plain manifest just leaves out) and compares whole objects keyed by kind, namespace
//! and name. Every difference is reported with its JSON path. `.ci/manifests.sh` separately
//! renders the chart with the real `helm` and validates both with `kubernetes-validate`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// The files of `k8s-cronjobs/`, which `bootstrap` embeds by name.
const PLAIN_FILES: [&str; 7] = [
    "00-namespace.yaml",
    "serviceaccount.yaml",
    "rbac.yaml",
    "cronjob.yaml",
    "admission.yaml",
    "webhook.yaml",
    "backup.yaml",
];
/// Every object the in-cluster pieces consist of, as [`object_key`] spells them.
const EXPECTED_OBJECTS: [&str; 28] = [
    "ClusterRole oxide-controller-backup-count",
    "ClusterRole oxide-controller-reconcile",
    "ClusterRole oxide-controller-webhook",
    "ClusterRoleBinding oxide-controller-backup-count",
    "ClusterRoleBinding oxide-controller-reconcile",
    "ClusterRoleBinding oxide-controller-webhook",
    "CronJob oxide-controller-backup/oxide-controller-backup",
    "CronJob oxide-controller-jobs/oxide-controller",
    "Deployment kube-system/oxide-controller-webhook",
    "Namespace oxide-controller-backup",
    "Namespace oxide-controller-jobs",
    "NetworkPolicy kube-system/oxide-controller-webhook",
    "Role default/oxide-controller-reconcile-certificates",
    "Role kube-system/oxide-controller-backup",
    "Role kube-system/oxide-controller-reconcile",
    "Role kube-system/oxide-controller-webhook",
    "Role oxide-controller-jobs/oxide-controller-webhook",
    "RoleBinding default/oxide-controller-reconcile-certificates",
    "RoleBinding kube-system/oxide-controller-backup",
    "RoleBinding kube-system/oxide-controller-reconcile",
    "RoleBinding kube-system/oxide-controller-webhook",
    "RoleBinding oxide-controller-jobs/oxide-controller-webhook",
    "Service kube-system/oxide-controller-webhook",
    "ServiceAccount kube-system/oxide-controller-webhook",
    "ServiceAccount oxide-controller-backup/oxide-controller-backup",
    "ServiceAccount oxide-controller-jobs/oxide-controller-reconcile",
    "ValidatingAdmissionPolicy oxide-controller-webhook-jobs",
    "ValidatingAdmissionPolicyBinding oxide-controller-webhook-jobs",
];
const BINARIES: [&str; 3] = ["bootstrap", "reconcile-once", "scale"];
const IMAGE_REPOSITORY: &str = "ghcr.io/aifoundry-org/oxide-controller";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace root")
        .to_path_buf()
}

fn chart_dir() -> PathBuf {
    repo_root().join("charts/oxide-controller")
}

fn plain_dir() -> PathBuf {
    repo_root().join("k8s-cronjobs")
}

// ---------------------------------------------------------------------------------------------
// The Go-template subset.

/// One piece of a template: literal text, or an action between `{{` and `}}`.
#[derive(Debug)]
enum Piece<'a> {
    Text(&'a str),
    Action(&'a str),
}

/// Splits a template into text and actions and applies the trim markers: `{{- ` removes the
/// white space before the action, ` -}}` the white space after it (as Go's text/template does:
/// it trims the neighbouring text, never another action's output).
fn lex(src: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut raw = Vec::new();
    let mut rest = src;
    while let Some(open) = rest.find("{{") {
        raw.push((Piece::Text(&rest[..open]), false, false));
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| format!("unclosed action at {:?}", truncate(&rest[open..])))?;
        let mut body = &after[..close];
        let trim_left = body.starts_with("- ") || body.starts_with("-\n") || body == "-";
        if trim_left {
            body = &body[1..];
        }
        let trim_right = body.ends_with(" -") || body.ends_with("\n-");
        if trim_right {
            body = &body[..body.len() - 1];
        }
        raw.push((Piece::Action(body.trim()), trim_left, trim_right));
        rest = &after[close + 2..];
    }
    raw.push((Piece::Text(rest), false, false));

    let mut pieces = Vec::with_capacity(raw.len());
    for i in 0..raw.len() {
        match raw[i].0 {
            Piece::Action(body) => pieces.push(Piece::Action(body)),
            Piece::Text(mut text) => {
                if i > 0 && raw[i - 1].2 {
                    text = text.trim_start();
                }
                if i + 1 < raw.len() && raw[i + 1].1 {
                    text = text.trim_end();
                }
                pieces.push(Piece::Text(text));
            }
        }
    }
    Ok(pieces)
}

fn truncate(s: &str) -> &str {
    let end = s.char_indices().nth(40).map_or(s.len(), |(i, _)| i);
    &s[..end]
}

/// What an action may see: `.Values`, `.Chart`, the chart's files and the API versions the
/// cluster serves (`.Capabilities.APIVersions`: only those given, as `helm template
/// --api-versions` lists them; Helm's built-in Kubernetes versions are not modelled).
struct Scope<'a> {
    values: &'a Value,
    chart: &'a Value,
    api_versions: &'a [&'a str],
    /// The chart's directory, for `.Files.Get`; None: no files.
    files: Option<&'a Path>,
}

impl Scope<'_> {
    /// Resolves `.Values.a.b` or `.Chart.AppVersion` (Chart fields are the capitalised
    /// Chart.yaml keys, as in Helm).
    fn lookup(&self, reference: &str) -> Result<&Value, String> {
        let (root, path) = if let Some(path) = reference.strip_prefix(".Values.") {
            (self.values, path.to_owned())
        } else if let Some(field) = reference.strip_prefix(".Chart.") {
            let mut chars = field.chars();
            let first = chars.next().ok_or("empty Chart field")?;
            (self.chart, first.to_lowercase().chain(chars).collect())
        } else {
            return Err(format!("unsupported reference {reference:?}"));
        };
        let mut at = root;
        for part in path.split('.') {
            at = at
                .get(part)
                .ok_or_else(|| format!("{reference} is not set (no {part:?})"))?;
        }
        Ok(at)
    }
}

/// A scalar printed the way Go's text/template prints Helm values.
fn scalar(reference: &str, value: &Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Bool(b) => Ok(b.to_string()),
        // Helm parses values as float64 and prints integral ones (below 1e21) without a
        // fraction; fractions and huge numbers print differently, so the chart avoids them.
        Value::Number(n) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        other => Err(format!(
            "{reference} is {other}; only strings, booleans and integers can be printed (use toYaml)"
        )),
    }
}

/// Helm's `toYaml`: the YAML of a value without the trailing newline.
fn to_yaml(value: &Value) -> Result<String, String> {
    let text = serde_saphyr::to_string(value).map_err(|e| format!("toYaml: {e}"))?;
    Ok(text.trim_end_matches('\n').to_owned())
}

/// Sprig's `nindent`: a newline, then every line indented by `n` spaces.
fn nindent(n: usize, s: &str) -> String {
    let pad = " ".repeat(n);
    format!("\n{pad}{}", s.replace('\n', &format!("\n{pad}")))
}

fn eval(action: &str, scope: &Scope<'_>) -> Result<String, String> {
    if action.starts_with("/*") && action.ends_with("*/") {
        return Ok(String::new());
    }
    let mut stages = action.split('|').map(str::trim);
    let head: Vec<&str> = stages
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let mut out = match head.as_slice() {
        [".Files.Get", path] => {
            let path = path
                .strip_prefix('"')
                .and_then(|p| p.strip_suffix('"'))
                .ok_or_else(|| format!(".Files.Get wants a string, got {path:?}"))?;
            let dir = scope.files.ok_or(".Files.Get without a chart")?;
            fs::read_to_string(dir.join(path)).map_err(|e| format!(".Files.Get {path:?}: {e}"))?
        }
        [reference] if reference.starts_with('.') => scalar(reference, scope.lookup(reference)?)?,
        ["toYaml", reference] => to_yaml(scope.lookup(reference)?)?,
        _ => return Err(format!("unsupported template action {{{{ {action} }}}}")),
    };
    for stage in stages {
        let words: Vec<&str> = stage.split_whitespace().collect();
        out = match words.as_slice() {
            ["nindent", n] => {
                let n: usize = n
                    .parse()
                    .map_err(|_| format!("nindent wants a number, got {n:?}"))?;
                nindent(n, &out)
            }
            _ => {
                return Err(format!(
                    "unsupported pipeline stage {stage:?} in {{{{ {action} }}}}"
                ));
            }
        };
    }
    Ok(out)
}

/// A word, a string literal or a parenthesis of a condition.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Open,
    Close,
    Str(String),
    Word(String),
}

fn tokens(src: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = src.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '(' | ')' => {
                chars.next();
                out.push(if c == '(' { Token::Open } else { Token::Close });
            }
            '"' => {
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => return Err(format!("escapes are not supported in {src:?}")),
                        Some(c) => s.push(c),
                        None => return Err(format!("unclosed string in {src:?}")),
                    }
                }
                out.push(Token::Str(s));
            }
            _ => {
                let mut w = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || c == '(' || c == ')' || c == '"' {
                        break;
                    }
                    w.push(c);
                    chars.next();
                }
                out.push(Token::Word(w));
            }
        }
    }
    Ok(out)
}

/// Go's template truth: false, 0, nil and empty strings, lists and maps are false.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
    }
}

/// A condition: an operand, or `and`, `or`, `not`, `eq`, `ne` applied to operands (a value
/// reference, a string literal, `true`/`false`, a parenthesised condition).
fn condition(tokens: &[Token], at: &mut usize, scope: &Scope<'_>) -> Result<Value, String> {
    if tokens.get(*at) == Some(&Token::Word(".Capabilities.APIVersions.Has".into())) {
        return match tokens.get(*at + 1) {
            Some(Token::Str(v)) => {
                *at += 2;
                Ok(Value::Bool(scope.api_versions.contains(&v.as_str())))
            }
            _ => Err(".Capabilities.APIVersions.Has wants one string".into()),
        };
    }
    let function = match tokens.get(*at) {
        Some(Token::Word(w)) if matches!(w.as_str(), "and" | "or" | "not" | "eq" | "ne") => {
            *at += 1;
            w.clone()
        }
        _ => return operand(tokens, at, scope),
    };
    let mut args = Vec::new();
    while *at < tokens.len() && tokens[*at] != Token::Close {
        args.push(operand(tokens, at, scope)?);
    }
    match (function.as_str(), args.as_slice()) {
        ("not", [a]) => Ok(Value::Bool(!truthy(a))),
        ("eq", [a, b]) => Ok(Value::Bool(a == b)),
        ("ne", [a, b]) => Ok(Value::Bool(a != b)),
        ("and", [_, _, ..]) => Ok(Value::Bool(args.iter().all(truthy))),
        ("or", [_, _, ..]) => Ok(Value::Bool(args.iter().any(truthy))),
        _ => Err(format!(
            "{function} with {} arguments is not supported",
            args.len()
        )),
    }
}

fn operand(tokens: &[Token], at: &mut usize, scope: &Scope<'_>) -> Result<Value, String> {
    let token = tokens.get(*at).ok_or("a condition ends too early")?.clone();
    *at += 1;
    match token {
        Token::Open => {
            let v = condition(tokens, at, scope)?;
            if tokens.get(*at) != Some(&Token::Close) {
                return Err("unbalanced parentheses".into());
            }
            *at += 1;
            Ok(v)
        }
        Token::Str(s) => Ok(Value::String(s)),
        Token::Word(w) if w == "true" || w == "false" => Ok(Value::Bool(w == "true")),
        Token::Word(w) if w.starts_with('.') => scope.lookup(&w).cloned(),
        other => Err(format!("unsupported operand {other:?}")),
    }
}

fn eval_condition(src: &str, scope: &Scope<'_>) -> Result<bool, String> {
    let tokens = tokens(src)?;
    let mut at = 0;
    let v = condition(&tokens, &mut at, scope)?;
    if at != tokens.len() {
        return Err(format!("unsupported condition {src:?}"));
    }
    Ok(truthy(&v))
}

/// Renders one template with the subset; anything outside it is an error naming the action.
/// Beyond value output: `if COND` / `else` / `end`, and `fail "message"` (Helm's, which stops
/// the rendering with that message).
fn render_template(src: &str, values: &Value, chart: &Value) -> Result<String, String> {
    render_template_in(
        src,
        &Scope {
            values,
            chart,
            api_versions: &[],
            files: None,
        },
    )
}

/// [`render_template`] with files and API versions.
fn render_template_in(src: &str, scope: &Scope<'_>) -> Result<String, String> {
    let mut out = String::with_capacity(src.len());
    // Per open `if`: whether its enclosing branch is rendered, whether this branch is.
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let live = |stack: &[(bool, bool)]| stack.last().is_none_or(|&(outer, this)| outer && this);
    for piece in lex(src)? {
        match piece {
            Piece::Text(text) if live(&stack) => out.push_str(text),
            Piece::Text(_) => {}
            Piece::Action(action) => {
                if let Some(cond) = action.strip_prefix("if ") {
                    let outer = live(&stack);
                    let this = outer && eval_condition(cond, scope)?;
                    stack.push((outer, this));
                } else if action == "else" {
                    let (outer, this) = stack.pop().ok_or("else without if")?;
                    stack.push((outer, !this));
                } else if action == "end" {
                    stack.pop().ok_or("end without if")?;
                } else if !live(&stack) {
                } else if let Some(message) = action.strip_prefix("fail ") {
                    let message = match tokens(message)?.as_slice() {
                        [Token::Str(s)] => s.clone(),
                        _ => return Err(format!("fail wants one string, got {message:?}")),
                    };
                    return Err(format!("execution error: {message}"));
                } else {
                    out.push_str(&eval(action, scope)?);
                }
            }
        }
    }
    if !stack.is_empty() {
        return Err("if without end".into());
    }
    Ok(out)
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn parse_yaml(text: &str, origin: &str) -> Result<Value, String> {
    serde_saphyr::from_str(text).map_err(|e| format!("{origin}: {e}"))
}

fn parse_documents(text: &str, origin: &str) -> Result<Vec<Value>, String> {
    serde_saphyr::from_multiple(text).map_err(|e| format!("{origin}: {e}"))
}

/// `helm template` of the chart in `dir` at its default values, as parsed documents.
fn render_chart(dir: &Path) -> Result<Vec<Value>, String> {
    render_chart_with(dir, &[])
}

/// `helm template --set PATH=VALUE ...` of the chart in `dir` (PATH dotted, as `--set` takes it).
fn render_chart_with(dir: &Path, set: &[(&str, Value)]) -> Result<Vec<Value>, String> {
    render_chart_for(dir, set, &[])
}

/// [`render_chart_with`] for a cluster that serves `api_versions` (`--api-versions`).
fn render_chart_for(
    dir: &Path,
    set: &[(&str, Value)],
    api_versions: &[&str],
) -> Result<Vec<Value>, String> {
    let chart = parse_yaml(&read(&dir.join("Chart.yaml")), "Chart.yaml")?;
    let mut values = parse_yaml(&read(&dir.join("values.yaml")), "values.yaml")?;
    for (path, value) in set {
        let mut at = &mut values;
        for part in path.split('.') {
            at = &mut at[part];
        }
        *at = value.clone();
    }
    let mut templates: Vec<PathBuf> = fs::read_dir(dir.join("templates"))
        .map_err(|e| format!("templates/: {e}"))?
        .map(|entry| entry.map(|e| e.path()).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    templates.sort();
    let mut docs = Vec::new();
    for path in templates {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        // Helpers (`_*.tpl`) and NOTES.txt would need `define`/`include`, which the subset
        // does not have: refuse them rather than silently render less than Helm.
        if !name.ends_with(".yaml") {
            return Err(format!(
                "templates/{name}: only plain .yaml templates are supported"
            ));
        }
        let scope = Scope {
            values: &values,
            chart: &chart,
            api_versions,
            files: Some(dir),
        };
        let rendered = render_template_in(&read(&path), &scope)
            .map_err(|e| format!("templates/{name}: {e}"))?;
        docs.extend(parse_documents(
            &rendered,
            &format!("rendered templates/{name}"),
        )?);
    }
    Ok(docs)
}

/// All documents of the plain manifests in `dir` (the files `bootstrap` embeds).
fn plain_documents(dir: &Path) -> Result<Vec<Value>, String> {
    let mut docs = Vec::new();
    for file in PLAIN_FILES {
        docs.extend(parse_documents(&read(&dir.join(file)), file)?);
    }
    Ok(docs)
}

// ---------------------------------------------------------------------------------------------
// Comparison.

fn object_key(doc: &Value) -> Result<String, String> {
    let kind = doc["kind"]
        .as_str()
        .ok_or_else(|| format!("a document without kind: {doc}"))?;
    let name = doc["metadata"]["name"]
        .as_str()
        .ok_or_else(|| format!("a {kind} without metadata.name"))?;
    Ok(match doc["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    })
}

/// Drops nulls, empty maps and empty lists, recursively: they mean "not set" to the API.
fn normalize(value: &Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::Object(map) => {
            let kept: serde_json::Map<String, Value> = map
                .iter()
                .filter_map(|(k, v)| normalize(v).map(|v| (k.clone(), v)))
                .collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        Value::Array(items) => {
            let kept: Vec<Value> = items.iter().filter_map(normalize).collect();
            (!kept.is_empty()).then_some(Value::Array(kept))
        }
        scalar => Some(scalar.clone()),
    }
}

fn by_key(docs: &[Value]) -> Result<BTreeMap<String, Value>, String> {
    let mut out = BTreeMap::new();
    for doc in docs {
        let key = object_key(doc)?;
        let value = normalize(doc).unwrap_or(Value::Null);
        if out.insert(key.clone(), value).is_some() {
            return Err(format!("{key} is defined twice"));
        }
    }
    Ok(out)
}

fn diff_values(path: &str, chart: &Value, plain: &Value, out: &mut Vec<String>) {
    match (chart, plain) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(vb) => diff_values(&p, va, vb, out),
                    None => out.push(format!("{p}: only in the chart: {va}")),
                }
            }
            for (k, vb) in b {
                if !a.contains_key(k) {
                    out.push(format!("{path}.{k}: only in k8s-cronjobs: {vb}"));
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                diff_values(&format!("{path}[{i}]"), va, vb, out);
            }
            for (i, va) in a.iter().enumerate().skip(b.len()) {
                out.push(format!("{path}[{i}]: only in the chart: {va}"));
            }
            for (i, vb) in b.iter().enumerate().skip(a.len()) {
                out.push(format!("{path}[{i}]: only in k8s-cronjobs: {vb}"));
            }
        }
        (a, b) if a != b => out.push(format!("{path}: chart {a} vs k8s-cronjobs {b}")),
        _ => {}
    }
}

/// Every difference between the chart in `chart` (default values) and the manifests in
/// `plain`, one line each, prefixed with the object.
fn drift(chart: &Path, plain: &Path) -> Result<Vec<String>, String> {
    let rendered = by_key(&render_chart(chart)?)?;
    let manifests = by_key(&plain_documents(plain)?)?;
    let mut out = Vec::new();
    for (key, a) in &rendered {
        match manifests.get(key) {
            Some(b) => {
                let mut diffs = Vec::new();
                diff_values("", a, b, &mut diffs);
                out.extend(diffs.into_iter().map(|d| format!("{key}: {d}")));
            }
            None => out.push(format!("{key}: only in the chart")),
        }
    }
    for key in manifests.keys().filter(|k| !rendered.contains_key(*k)) {
        out.push(format!("{key}: only in k8s-cronjobs"));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Drift.

#[test]
fn the_chart_at_default_values_renders_exactly_the_plain_manifests() {
    let rendered = by_key(&render_chart(&chart_dir()).unwrap()).unwrap();
    let plain = by_key(&plain_documents(&plain_dir()).unwrap()).unwrap();
    let keys: Vec<&str> = plain.keys().map(String::as_str).collect();
    assert_eq!(
        keys, EXPECTED_OBJECTS,
        "the plain manifests hold the in-cluster pieces"
    );
    let rendered_keys: Vec<&str> = rendered.keys().map(String::as_str).collect();
    assert_eq!(
        rendered_keys, EXPECTED_OBJECTS,
        "the chart renders the in-cluster pieces"
    );

    let diffs = drift(&chart_dir(), &plain_dir()).unwrap();
    assert!(
        diffs.is_empty(),
        "the chart and k8s-cronjobs/ have drifted apart:\n{}",
        diffs.join("\n")
    );
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Where a one-sided change is made.
#[derive(Debug, Clone, Copy)]
enum Side {
    Chart,
    Plain,
}

#[test]
fn a_change_made_on_one_side_only_is_reported_as_drift() {
    // (side, file, text, replacement, what the report must name)
    let cases: &[(Side, &str, &str, &str, &str)] = &[
        (
            Side::Chart,
            "templates/rbac.yaml",
            r#"verbs: ["list", "patch", "delete"]"#,
            r#"verbs: ["list", "patch", "delete", "update"]"#,
            "ClusterRole oxide-controller-reconcile: .rules[0].verbs[3]",
        ),
        (
            Side::Chart,
            "templates/rbac.yaml",
            r#"resourceNames: ["oxide-controller-webhook-ca"]"#,
            r#"resourceNames: ["oxide-controller-webhook-ca", "oxide-controller"]"#,
            "Role kube-system/oxide-controller-reconcile: .rules[2].resourceNames[1]",
        ),
        (
            Side::Chart,
            "values.yaml",
            r#"schedule: "*/5 * * * *""#,
            r#"schedule: "*/10 * * * *""#,
            "CronJob oxide-controller-jobs/oxide-controller: .spec.schedule",
        ),
        (
            Side::Chart,
            "values.yaml",
            "activeDeadlineSeconds: 270",
            "activeDeadlineSeconds: 600",
            ".spec.jobTemplate.spec.activeDeadlineSeconds",
        ),
        (
            Side::Chart,
            "values.yaml",
            "readOnlyRootFilesystem: true",
            "readOnlyRootFilesystem: false",
            ".securityContext.readOnlyRootFilesystem",
        ),
        (
            Side::Chart,
            "templates/webhook.yaml",
            "path: /readyz",
            "path: /ready",
            ".readinessProbe.httpGet.path",
        ),
        (
            Side::Plain,
            "rbac.yaml",
            r#"verbs: ["get", "delete"]"#,
            r#"verbs: ["get", "delete", "list"]"#,
            "Role oxide-controller-jobs/oxide-controller-webhook: .rules[1].verbs[2]: only in k8s-cronjobs",
        ),
        (
            Side::Plain,
            "cronjob.yaml",
            "            - key: node.cloudprovider.kubernetes.io/uninitialized\n              operator: Exists\n              effect: NoSchedule\n",
            "",
            ".tolerations[4]: only in the chart",
        ),
        (
            Side::Plain,
            "webhook.yaml",
            "image: ghcr.io/aifoundry-org/oxide-controller:0.1.0",
            "image: ghcr.io/aifoundry-org/oxide-controller:latest",
            "Deployment kube-system/oxide-controller-webhook: .spec.template.spec.containers[0].image",
        ),
        (
            Side::Plain,
            "webhook.yaml",
            "  type: ClusterIP",
            "  type: NodePort",
            "Service kube-system/oxide-controller-webhook: .spec.type",
        ),
    ];
    for &(side, file, from, to, expected) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let chart = tmp.path().join("chart");
        let plain = tmp.path().join("plain");
        copy_dir(&chart_dir(), &chart);
        copy_dir(&plain_dir(), &plain);
        assert!(
            drift(&chart, &plain).unwrap().is_empty(),
            "the copies agree before the change"
        );

        let path = match side {
            Side::Chart => chart.join(file),
            Side::Plain => plain.join(file),
        };
        let text = read(&path);
        assert_eq!(
            text.matches(from).count(),
            1,
            "{side:?} {file} holds {from:?} exactly once (update this case if the file changed)"
        );
        fs::write(&path, text.replacen(from, to, 1)).unwrap();

        let diffs = drift(&chart, &plain).unwrap();
        assert!(
            diffs.iter().any(|d| d.contains(expected)),
            "changing {from:?} to {to:?} in {side:?} {file} must be reported at {expected:?}; got:\n{}",
            diffs.join("\n")
        );
    }
}

#[test]
fn an_object_present_on_one_side_only_is_reported_as_drift() {
    let tmp = tempfile::tempdir().unwrap();
    let chart = tmp.path().join("chart");
    let plain = tmp.path().join("plain");
    copy_dir(&chart_dir(), &chart);
    copy_dir(&plain_dir(), &plain);
    let extra = "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\n  namespace: kube-system\n";
    let rbac = chart.join("templates/rbac.yaml");
    fs::write(&rbac, read(&rbac) + extra).unwrap();
    let diffs = drift(&chart, &plain).unwrap();
    assert_eq!(diffs, ["ConfigMap kube-system/extra: only in the chart"]);
}

// ---------------------------------------------------------------------------------------------
// The renderer itself.

#[test]
fn the_renderer_implements_the_subset_as_helm_does() {
    let values = json!({
        "a": {"b": "text", "n": 270, "t": true},
        "list": [{"key": "k", "operator": "Exists"}],
        "empty": {},
    });
    let chart = json!({"appVersion": "1.2.3", "name": "c"});
    let cases: &[(&str, &str)] = &[
        ("x: {{ .Values.a.b }}", "x: text"),
        ("x: {{ .Values.a.n }} {{ .Values.a.t }}", "x: 270 true"),
        (
            "x: \"{{ .Chart.AppVersion }}\" {{ .Chart.Name }}",
            "x: \"1.2.3\" c",
        ),
        // `{{-` eats the white space before it (newlines included), `-}}` the white space after.
        ("a:\n  {{- .Values.a.b }}", "a:text"),
        ("{{ .Values.a.b -}}  \n  z", "textz"),
        ("{{/* a comment */}}x", "x"),
        ("{{- /* a comment */ -}}\n\nx", "x"),
        (
            "l:\n  {{- toYaml .Values.list | nindent 2 }}",
            "l:\n  - key: k\n    operator: Exists",
        ),
    ];
    for (src, want) in cases {
        let got = render_template(src, &values, &chart).unwrap();
        if got.starts_with("l:") {
            // The exact layout of toYaml is the YAML library's; what matters is the data.
            let parsed: Value = serde_saphyr::from_str(&got).unwrap();
            assert_eq!(
                parsed,
                json!({"l": [{"key": "k", "operator": "Exists"}]}),
                "{src:?}"
            );
        } else {
            assert_eq!(&got, want, "{src:?}");
        }
    }
    let nested = render_template(
        "m:\n  {{- toYaml .Values.a | nindent 2 }}\n",
        &values,
        &chart,
    )
    .unwrap();
    let parsed: Value = serde_saphyr::from_str(&nested).unwrap();
    assert_eq!(parsed, json!({"m": {"b": "text", "n": 270, "t": true}}));

    // toYaml keeps strings that look like other types strings, as Helm's does.
    let tricky =
        json!({"s": {"port": "80", "flag": "true", "cron": "*/5 * * * *", "none": "null"}});
    let text = render_template(
        "s:\n  {{- toYaml .Values.s | nindent 2 }}\n",
        &tricky,
        &chart,
    )
    .unwrap();
    let parsed: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(parsed, tricky, "{text}");
}

#[test]
fn the_renderer_implements_conditions_and_fail_as_helm_does() {
    let values = json!({"s": "ClusterIP", "t": true, "f": false, "e": [], "l": ["a"], "z": 0});
    let chart = json!({"appVersion": "1"});
    let cases: &[(&str, &str)] = &[
        ("{{ if .Values.t }}y{{ end }}", "y"),
        ("{{ if .Values.f }}y{{ else }}n{{ end }}", "n"),
        // Go's truth: empty lists and zero are false, a non-empty list true.
        ("{{ if .Values.e }}y{{ else }}n{{ end }}", "n"),
        ("{{ if .Values.z }}y{{ else }}n{{ end }}", "n"),
        ("{{ if .Values.l }}y{{ end }}", "y"),
        ("{{ if eq .Values.s \"ClusterIP\" }}y{{ end }}", "y"),
        (
            "{{ if ne .Values.s \"ClusterIP\" }}y{{ else }}n{{ end }}",
            "n",
        ),
        (
            "{{ if not (or (eq .Values.s \"NodePort\") .Values.f) }}y{{ end }}",
            "y",
        ),
        ("{{ if and .Values.t .Values.l }}y{{ end }}", "y"),
        ("{{ if and .Values.t .Values.e }}y{{ else }}n{{ end }}", "n"),
        // Nested, and a branch not taken is not evaluated (its fail does not fire).
        (
            "{{ if .Values.t }}a{{ if .Values.f }}b{{ else }}c{{ end }}d{{ end }}",
            "acd",
        ),
        ("{{ if .Values.f }}{{ fail \"no\" }}{{ end }}ok", "ok"),
        ("a\n  {{- if .Values.t }}\n  b\n  {{- end }}\n", "a\n  b\n"),
    ];
    for (src, want) in cases {
        assert_eq!(
            &render_template(src, &values, &chart).unwrap(),
            want,
            "{src:?}"
        );
    }
    let err = render_template(
        "x{{ if .Values.t }}{{ fail \"the reason\" }}{{ end }}",
        &values,
        &chart,
    )
    .unwrap_err();
    assert!(err.contains("the reason"), "{err}");
}

#[test]
fn the_renderer_refuses_what_it_does_not_implement() {
    let values = json!({"a": {"b": "text"}, "m": {"k": "v"}, "f": 1.5});
    let chart = json!({"appVersion": "1"});
    let cases: &[(&str, &str)] = &[
        (
            "{{ range .Values.a }}x{{ end }}",
            "unsupported template action",
        ),
        ("{{ if .Values.a }}x", "if without end"),
        ("x{{ end }}", "end without if"),
        (
            "{{ if default .Values.a }}x{{ end }}",
            "unsupported operand",
        ),
        ("{{ if eq .Values.a.b }}x{{ end }}", "eq with 1 arguments"),
        ("{{ fail .Values.a.b }}", "fail wants one string"),
        ("{{ .Values.a.b | quote }}", "unsupported pipeline stage"),
        ("{{ include \"x\" . }}", "unsupported template action"),
        ("{{ .Release.Namespace }}", "unsupported reference"),
        ("{{ .Values.a.missing }}", "is not set"),
        ("{{ .Values.m }}", "use toYaml"),
        ("{{ .Values.f }}", "use toYaml"),
        (
            "{{ toYaml .Values.m | nindent x }}",
            "nindent wants a number",
        ),
        ("{{ .Values.a.b ", "unclosed action"),
    ];
    for (src, want) in cases {
        let err = render_template(src, &values, &chart).unwrap_err();
        assert!(err.contains(want), "{src:?}: {err}");
    }
}

// ---------------------------------------------------------------------------------------------
// What both sides must say.

fn both_sides() -> Vec<(&'static str, BTreeMap<String, Value>)> {
    vec![
        (
            "chart",
            by_key(&render_chart(&chart_dir()).unwrap()).unwrap(),
        ),
        (
            "k8s-cronjobs",
            by_key(&plain_documents(&plain_dir()).unwrap()).unwrap(),
        ),
    ]
}

/// Every pod spec in `value` (any object with `containers`), with its path.
fn pod_specs<'a>(path: String, value: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    match value {
        Value::Object(map) => {
            if map.contains_key("containers") {
                out.push((path.clone(), value));
            }
            for (k, v) in map {
                pod_specs(format!("{path}.{k}"), v, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                pod_specs(format!("{path}[{i}]"), v, out);
            }
        }
        _ => {}
    }
}

#[test]
fn every_pod_runs_as_non_root_read_only_without_privileges() {
    for (side, objects) in both_sides() {
        let mut specs = Vec::new();
        for (key, object) in &objects {
            pod_specs(key.clone(), object, &mut specs);
        }
        assert_eq!(
            specs.len(),
            3,
            "{side}: the two CronJobs' and the webhook's pods"
        );
        for (at, spec) in specs {
            if spec["serviceAccountName"] == "oxide-controller-backup" {
                backup_pod_reads_only_k3s_snapshots(&format!("{side} {at}"), spec);
                continue;
            }
            assert!(
                spec["serviceAccountName"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("oxide-controller-")),
                "{side} {at}: one of our two accounts"
            );
            // They call the API, so they need the token.
            assert_eq!(spec["automountServiceAccountToken"], true, "{side} {at}");
            assert_eq!(spec["hostNetwork"], Value::Null, "{side} {at}");
            assert_eq!(spec["hostPID"], Value::Null, "{side} {at}");
            let pod = &spec["securityContext"];
            assert_eq!(pod["runAsNonRoot"], true, "{side} {at}");
            assert_eq!(pod["runAsUser"], 65532, "{side} {at}");
            assert_eq!(
                pod["seccompProfile"]["type"], "RuntimeDefault",
                "{side} {at}"
            );

            let mut containers: Vec<&Value> =
                spec["containers"].as_array().unwrap().iter().collect();
            if let Some(init) = spec["initContainers"].as_array() {
                containers.extend(init);
            }
            assert!(!containers.is_empty(), "{side} {at}");
            for c in containers {
                let name = c["name"].as_str().unwrap();
                let sc = &c["securityContext"];
                let at = format!("{side} {at} container {name}");
                assert_eq!(sc["runAsNonRoot"], true, "{at}");
                assert_eq!(sc["runAsUser"], 65532, "{at}");
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{at}");
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{at}");
                assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{at}");
                assert_eq!(sc["capabilities"]["add"], Value::Null, "{at}");
                assert_ne!(sc["privileged"], true, "{at}");
                assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{at}");

                let image = c["image"].as_str().unwrap();
                assert!(
                    image.starts_with(&format!("{IMAGE_REPOSITORY}:")),
                    "{at}: {image}"
                );
                let command = c["command"][0].as_str().unwrap();
                assert!(
                    BINARIES
                        .iter()
                        .any(|b| command == format!("/usr/local/bin/{b}")),
                    "{at} runs {command}, which the image does not have"
                );
                assert!(c["resources"]["requests"]["memory"].is_string(), "{at}");
                assert!(c["resources"]["limits"]["memory"].is_string(), "{at}");
            }
        }
    }
}

/// The backup pod is the one exception to non-root (it reads k3s's snapshots, which etcd
/// writes 0600 as root): root without any capability, a read-only root filesystem, and one
/// host path, k3s's snapshot directory, mounted read-only; no host network or PID namespace.
/// Its one other volume is its rack credentials' Secret, read-only, root-only files.
fn backup_pod_reads_only_k3s_snapshots(at: &str, spec: &Value) {
    const SNAPSHOTS: &str = "/var/lib/rancher/k3s/server/db/snapshots";
    const RACK: &str = "/var/run/secrets/oxide-controller-rack";
    assert_eq!(spec["automountServiceAccountToken"], true, "{at}");
    assert_eq!(spec["hostNetwork"], Value::Null, "{at}");
    assert_eq!(spec["hostPID"], Value::Null, "{at}");
    assert_eq!(spec["hostIPC"], Value::Null, "{at}");
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
        "{at}"
    );
    assert_eq!(
        spec["nodeSelector"]["node-role.kubernetes.io/control-plane"], "true",
        "{at}: servers only"
    );
    let volumes = spec["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 2, "{at}: two volumes");
    assert_eq!(volumes[0]["hostPath"]["path"], SNAPSHOTS, "{at}");
    assert_eq!(
        volumes[1]["secret"],
        json!({"secretName": "oxide-controller-rack", "defaultMode": 0o400}),
        "{at}"
    );
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "{at}");
    assert_eq!(spec["initContainers"], Value::Null, "{at}");
    let c = &containers[0];
    assert_eq!(
        c["volumeMounts"],
        json!([{"name": volumes[0]["name"], "mountPath": SNAPSHOTS, "readOnly": true},
            {"name": volumes[1]["name"], "mountPath": RACK, "readOnly": true}]),
        "{at}"
    );
    assert_eq!(
        c["args"],
        json!(["backup", "--snapshot-dir", SNAPSHOTS, "--rack-dir", RACK]),
        "{at}"
    );
    assert_eq!(
        c["command"],
        json!(["/usr/local/bin/reconcile-once"]),
        "{at}"
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{at}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{at}");
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{at}");
    assert_eq!(sc["capabilities"]["add"], Value::Null, "{at}");
    assert_ne!(sc["privileged"], true, "{at}");
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{at}");
    assert!(c["resources"]["limits"]["memory"].is_string(), "{at}");
}

/// One RBAC rule as the test states it: (apiGroup, resource, resourceNames, verbs).
type Rule = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
);

fn rules_of(object: &Value) -> Vec<(String, String, Vec<String>, Vec<String>)> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for rule in object["rules"].as_array().unwrap() {
        let names = strings(&rule["resourceNames"]);
        let verbs = strings(&rule["verbs"]);
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                out.push((group.clone(), resource, names.clone(), verbs.clone()));
            }
        }
    }
    out.sort();
    out
}

fn expected_rules(rules: &[Rule]) -> Vec<(String, String, Vec<String>, Vec<String>)> {
    let owned = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let mut out: Vec<_> = rules
        .iter()
        .map(|(g, r, n, v)| ((*g).to_owned(), (*r).to_owned(), owned(n), owned(v)))
        .collect();
    out.sort();
    out
}

/// An account's expected roles: (role object key, binding object key, rules).
struct Grant {
    role: &'static str,
    binding: &'static str,
    rules: &'static [Rule],
}

#[test]
fn each_account_may_make_exactly_the_calls_its_function_makes() {
    // The calls, from shared/src/adapters/kube_cluster.rs, shared/src/adapters/kube_store.rs
    // and the webhook: a call added or removed there changes this table and both manifests.
    // functions/reconcile-once/tests/rbac.rs proves each verb needed against a real API.
    let reconcile = (
        "oxide-controller-jobs",
        "oxide-controller-reconcile",
        [
            Grant {
                role: "ClusterRole oxide-controller-reconcile",
                binding: "ClusterRoleBinding oxide-controller-reconcile",
                rules: &[
                    ("", "nodes", &[], &["list", "patch", "delete"]), // observe, cordon/annotate, remove
                    ("", "pods", &[], &["list"]), // drain, autoscaling; never delete (issue 34 §2)
                    ("", "pods/eviction", &[], &["create"]), // drain through the Eviction API
                    ("policy", "poddisruptionbudgets", &[], &["list"]), // budgets keep nodes
                    ("", "persistentvolumes", &[], &["list"]), // volumes pinned to nodes
                ],
            },
            Grant {
                role: "Role kube-system/oxide-controller-reconcile",
                binding: "RoleBinding kube-system/oxide-controller-reconcile",
                rules: &[
                    ("", "secrets", &["oxide-controller"], &["get"]),
                    // The webhook's serving pair, re-issued; its CA's key (issue 46).
                    (
                        "",
                        "secrets",
                        &["oxide-controller-webhook-tls"],
                        &["get", "update"],
                    ),
                    ("", "secrets", &["oxide-controller-webhook-ca"], &["get"]),
                    ("", "configmaps", &["oxide-controller"], &["get", "update"]),
                    // The webhook's counts, applied within its limits, and backup.json
                    // (audit security-2 N4).
                    (
                        "",
                        "configmaps",
                        &["oxide-controller-scale", "oxide-controller-backup"],
                        &["get"],
                    ),
                    (
                        "coordination.k8s.io",
                        "leases",
                        &["oxide-controller"],
                        &["get", "update"],
                    ),
                    ("coordination.k8s.io", "leases", &[], &["create"]),
                    ("events.k8s.io", "events", &[], &["create"]),
                ],
            },
        ]
        .as_slice(),
    );
    let webhook = (
        "kube-system",
        "oxide-controller-webhook",
        [
            Grant {
                role: "ClusterRole oxide-controller-webhook",
                binding: "ClusterRoleBinding oxide-controller-webhook",
                rules: &[
                    ("", "nodes", &[], &["list"]),         // the version gate
                    ("", "pods", &[], &["list", "watch"]), // pods the scheduler cannot place
                ],
            },
            Grant {
                role: "Role kube-system/oxide-controller-webhook",
                binding: "RoleBinding kube-system/oxide-controller-webhook",
                rules: &[
                    // Reads the spec; writes only its counts (audit security-2 N4).
                    ("", "configmaps", &["oxide-controller"], &["get"]),
                    (
                        "",
                        "configmaps",
                        &["oxide-controller-scale"],
                        &["get", "update"],
                    ),
                    (
                        "coordination.k8s.io",
                        "leases",
                        &["oxide-controller"],
                        &["get"],
                    ),
                ],
            },
            Grant {
                role: "Role oxide-controller-jobs/oxide-controller-webhook",
                binding: "RoleBinding oxide-controller-jobs/oxide-controller-webhook",
                rules: &[
                    ("batch", "cronjobs", &["oxide-controller"], &["get"]),
                    (
                        "batch",
                        "jobs",
                        &["oxide-controller-now"],
                        &["get", "delete"],
                    ),
                    ("batch", "jobs", &[], &["create"]),
                ],
            },
        ]
        .as_slice(),
    );
    let backup = (
        "oxide-controller-backup",
        "oxide-controller-backup",
        [Grant {
            role: "Role kube-system/oxide-controller-backup",
            binding: "RoleBinding kube-system/oxide-controller-backup",
            rules: &[
                // spec, token fingerprint; no Secret (audit security-2 N1, N8)
                ("", "configmaps", &["oxide-controller"], &["get"]),
                // backup.json, the only object it writes (audit security-2 N4)
                (
                    "",
                    "configmaps",
                    &["oxide-controller-backup"],
                    &["get", "update"],
                ),
            ],
        }]
        .as_slice(),
    );
    for (side, objects) in both_sides() {
        for (account_ns, account, grants) in [reconcile, webhook, backup] {
            for g in grants {
                let role = &objects[g.role];
                assert_eq!(rules_of(role), expected_rules(g.rules), "{side} {}", g.role);
                // Least privilege in general: no wildcards, and every namespaced verb but
                // `create` (which RBAC cannot limit by name) limited to our named objects.
                for (group, resource, names, verbs) in rules_of(role) {
                    assert!(
                        group != "*" && resource != "*" && !verbs.iter().any(|v| v == "*"),
                        "{side}: wildcard in {group}/{resource} {verbs:?}"
                    );
                    if role["kind"] == "Role" {
                        if verbs.iter().any(|v| v != "create") {
                            assert!(
                                !names.is_empty(),
                                "{side}: {group}/{resource} {verbs:?} must name its objects"
                            );
                        } else {
                            assert!(
                                names.is_empty(),
                                "{side}: create cannot be limited by resourceNames"
                            );
                        }
                    }
                }
                let b = &objects[g.binding];
                let role_name = role["metadata"]["name"].clone();
                assert_eq!(
                    b["roleRef"],
                    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": role["kind"], "name": role_name}),
                    "{side} {}",
                    g.binding
                );
                assert_eq!(
                    b["subjects"],
                    json!([{"kind": "ServiceAccount", "name": account, "namespace": account_ns}]),
                    "{side} {}",
                    g.binding
                );
            }
        }
        // No account may read a Secret but the reconcile and backup ones, and none may
        // delete a pod.
        for (key, object) in &objects {
            if !matches!(object["kind"].as_str(), Some("Role" | "ClusterRole")) {
                continue;
            }
            for (_, resource, _, verbs) in rules_of(object) {
                assert!(
                    resource != "secrets"
                        || key == "Role kube-system/oxide-controller-reconcile"
                        || key == "Role kube-system/oxide-controller-backup",
                    "{side}: {key} may read Secrets"
                );
                assert!(
                    resource != "pods" || !verbs.iter().any(|v| v == "delete"),
                    "{side}: {key} may delete pods"
                );
            }
        }
        // Jobs run only where Pod Security `restricted` is enforced.
        let ns = &objects["Namespace oxide-controller-jobs"]["metadata"]["labels"];
        assert_eq!(
            ns["pod-security.kubernetes.io/enforce"], "restricted",
            "{side}"
        );
        assert_eq!(
            objects["CronJob oxide-controller-jobs/oxide-controller"]["spec"]["jobTemplate"]["spec"]
                ["template"]["spec"]["serviceAccountName"],
            "oxide-controller-reconcile",
            "{side}"
        );
        assert_eq!(
            objects["Deployment kube-system/oxide-controller-webhook"]["spec"]["template"]["spec"]
                ["serviceAccountName"],
            "oxide-controller-webhook",
            "{side}"
        );
    }
}

/// Every Secret a pod spec in `spec` refers to: volumes (and projected sources), `env` and
/// `envFrom` of every container.
fn secrets_referenced(spec: &Value) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut add = |v: &Value| {
        if let Some(n) = v.as_str() {
            names.insert(n.to_owned());
        }
    };
    for volume in spec["volumes"].as_array().into_iter().flatten() {
        add(&volume["secret"]["secretName"]);
        for source in volume["projected"]["sources"]
            .as_array()
            .into_iter()
            .flatten()
        {
            add(&source["secret"]["name"]);
        }
    }
    let containers = spec["containers"].as_array().into_iter().flatten();
    for c in containers.chain(spec["initContainers"].as_array().into_iter().flatten()) {
        for env in c["env"].as_array().into_iter().flatten() {
            add(&env["valueFrom"]["secretKeyRef"]["name"]);
        }
        for from in c["envFrom"].as_array().into_iter().flatten() {
            add(&from["secretRef"]["name"]);
        }
    }
    names
}

/// Audit H1: the Node authorizer lets a node's kubelet read, whole, every Secret a pod on it
/// refers to (https://kubernetes.io/docs/reference/access-authn-authz/node/), not only the
/// keys it mounts. So no pod of ours refers to the state Secret `oxide-controller` (rack,
/// join and Tailscale credentials): the webhook's pod mounts its tokens' Secret and its
/// serving pair's, nothing else; the reconcile reads the state Secret through the API.
#[test]
fn no_pod_refers_to_the_state_secret_and_the_webhook_mounts_only_its_own() {
    for (side, objects) in both_sides() {
        let mut specs = Vec::new();
        for (key, object) in &objects {
            pod_specs(key.clone(), object, &mut specs);
        }
        assert_eq!(specs.len(), 3, "{side}");
        for (at, spec) in &specs {
            let names = secrets_referenced(spec);
            assert!(
                !names.contains("oxide-controller"),
                "{side} {at} refers to Secret oxide-controller: {names:?}"
            );
        }
        let webhook =
            &objects["Deployment kube-system/oxide-controller-webhook"]["spec"]["template"]["spec"];
        assert_eq!(
            secrets_referenced(webhook),
            BTreeSet::from([
                "oxide-controller-webhook-auth".to_owned(),
                "oxide-controller-webhook-tls".to_owned(),
            ]),
            "{side}"
        );
    }
}

#[test]
fn a_reconcile_run_ends_before_its_job_deadline_and_the_job_before_the_next_tick() {
    let run_deadline = oxide_controller::domain::spec::Timeouts::default().run_deadline_seconds;
    for (side, objects) in both_sides() {
        let cron = &objects["CronJob oxide-controller-jobs/oxide-controller"]["spec"];
        let schedule = cron["schedule"].as_str().unwrap();
        let parsed = oxide_controller::domain::spec::parse_schedule(schedule).unwrap();
        let ticks: Vec<_> = parsed.upcoming(chrono::Utc::now()).take(50).collect();
        let interval = ticks
            .windows(2)
            .map(|w| (w[1] - w[0]).num_seconds())
            .min()
            .unwrap();
        let interval = u64::try_from(interval).unwrap();

        let job = &cron["jobTemplate"]["spec"];
        let active = job["activeDeadlineSeconds"].as_u64().unwrap();
        assert!(
            run_deadline < active && active < interval,
            "{side}: run deadline {run_deadline}s < activeDeadlineSeconds {active}s < interval {interval}s"
        );
        let starting = cron["startingDeadlineSeconds"].as_u64().unwrap();
        assert!(
            starting < interval,
            "{side}: a missed run is skipped before the next tick"
        );
        assert_eq!(cron["concurrencyPolicy"], "Forbid", "{side}");
        assert!(
            job["backoffLimit"].as_u64().unwrap() <= 2,
            "{side}: small backoffLimit"
        );
        assert!(job["ttlSecondsAfterFinished"].as_u64().is_some(), "{side}");

        let pod = &job["template"]["spec"];
        assert_eq!(pod["restartPolicy"], "Never", "{side}");
        assert_eq!(
            pod["priorityClassName"], "system-cluster-critical",
            "{side}"
        );
        let tolerations = pod["tolerations"].as_array().unwrap();
        for (key, effect) in [
            ("node-role.kubernetes.io/control-plane", "NoSchedule"),
            ("node.kubernetes.io/not-ready", "NoExecute"),
            ("node.kubernetes.io/unreachable", "NoExecute"),
            // A Node the (broken) Oxide CCM never initialised.
            (
                "node.cloudprovider.kubernetes.io/uninitialized",
                "NoSchedule",
            ),
        ] {
            assert!(
                tolerations
                    .iter()
                    .any(|t| t["key"] == key && t["operator"] == "Exists" && t["effect"] == effect),
                "{side}: the reconcile pod tolerates {key}:{effect} and only that effect"
            );
        }
        let container = &pod["containers"][0];
        assert_eq!(
            container["command"],
            json!(["/usr/local/bin/reconcile-once"]),
            "{side}"
        );
        let env = container["env"].as_array().unwrap();
        assert!(
            env.iter().any(|e| e["name"] == "POD_NAME"
                && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"),
            "{side}: the Lease holder is the pod name"
        );
        assert!(
            env.iter()
                .any(|e| e["name"] == "OXIDE_CONTROLLER_LOG_FORMAT" && e["value"] == "json"),
            "{side}"
        );
    }
}

/// Audit security-2 N9: no namespace reaches the webhook by default; the ones an
/// administrator names are selected by `kubernetes.io/metadata.name` (the API server sets it
/// to the name; nobody can change it), never by a label a namespace's creator chooses.
#[test]
fn only_namespaces_named_by_an_administrator_reach_the_webhook() {
    for (side, objects) in both_sides() {
        let deployment = &objects["Deployment kube-system/oxide-controller-webhook"]["spec"];
        let policy = &objects["NetworkPolicy kube-system/oxide-controller-webhook"]["spec"];
        assert_eq!(
            policy["podSelector"]["matchLabels"], deployment["template"]["metadata"]["labels"],
            "{side}: the policy selects the webhook's pods"
        );
        assert_eq!(policy["policyTypes"], json!(["Ingress"]), "{side}");
        // Normalized: an absent or empty `ingress` with policyType Ingress admits nothing.
        assert!(
            policy.get("ingress").is_none(),
            "{side}: no rule unless an administrator adds one: {}",
            policy["ingress"]
        );
        assert_eq!(
            deployment["template"]["spec"]["containers"][0]["ports"][0]["name"], "https",
            "{side}: the port a rule names"
        );
    }
    let named = by_key(
        &render_chart_with(
            &chart_dir(),
            &[("webhook.clientNamespaces", json!(["ci", "tools"]))],
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        named["NetworkPolicy kube-system/oxide-controller-webhook"]["spec"]["ingress"],
        json!([{"from": [{"namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ci", "tools"]}]}}],
            "ports": [{"protocol": "TCP", "port": "https"}]}]),
        "the chart: one rule, from the named namespaces only, to the https port"
    );
    // The plain manifest's comment gives the same rule for `kubectl patch`.
    let text = read(&plain_dir().join("webhook.yaml"));
    let patch: String = text
        .lines()
        .skip_while(|l| !l.contains("kubectl -n kube-system patch networkpolicy"))
        .skip(1)
        .take_while(|l| l.starts_with("#     "))
        .map(|l| l.trim_start_matches('#').trim())
        .collect::<Vec<_>>()
        .concat();
    let patch: Value = serde_json::from_str(patch.trim_matches('\'')).unwrap();
    assert_eq!(
        patch["spec"]["ingress"],
        named["NetworkPolicy kube-system/oxide-controller-webhook"]["spec"]["ingress"],
        "webhook.yaml's kubectl patch is the chart's rule"
    );
}

/// Every `image` a rendering names, anywhere in its objects.
fn images(docs: &[Value]) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("image", Value::String(s)) => out.push(s.clone()),
                        _ => walk(x, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    docs.iter().for_each(|d| walk(d, &mut out));
    out
}

/// Audit security-2 N12: with `image.digest` set, every container the chart renders runs
/// `repository@digest` (the tag unused); without it, by tag as the plain manifests do. The
/// digest's form is checked by helm against values.schema.json (`.ci/manifests.sh`).
#[test]
fn the_chart_runs_every_container_by_digest_when_given_one() {
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let by_tag = images(&render_chart(&chart_dir()).unwrap());
    assert_eq!(by_tag.len(), 3, "{by_tag:?}");
    assert!(
        by_tag
            .iter()
            .all(|i| i == "ghcr.io/aifoundry-org/oxide-controller:0.1.0"),
        "{by_tag:?}"
    );
    let pinned =
        images(&render_chart_with(&chart_dir(), &[("image.digest", json!(digest))]).unwrap());
    assert_eq!(pinned.len(), 3, "{pinned:?}");
    assert!(
        pinned
            .iter()
            .all(|i| *i == format!("ghcr.io/aifoundry-org/oxide-controller@{digest}")),
        "{pinned:?}"
    );
    let schema: Value =
        serde_json::from_str(&read(&chart_dir().join("values.schema.json"))).unwrap();
    assert_eq!(
        schema["properties"]["image"]["properties"]["digest"]["pattern"],
        "^(sha256:[0-9a-f]{64})?$",
        "the chart takes the digest form bootstrap takes (domain::digests::check_image_reference)"
    );
}

/// Audit security-2 N9: the chart renders the webhook's Service only as ClusterIP, unless the
/// operator says `webhook.allowExternal: true`.
#[test]
fn the_chart_refuses_an_external_webhook_service_unless_allowed() {
    for kind in ["LoadBalancer", "NodePort"] {
        let err =
            render_chart_with(&chart_dir(), &[("webhook.service.type", json!(kind))]).unwrap_err();
        assert!(
            err.contains("templates/webhook.yaml")
                && err.contains("webhook.service.type is not ClusterIP")
                && err.contains("webhook.allowExternal=true"),
            "{kind}: {err}"
        );
        let allowed = by_key(
            &render_chart_with(
                &chart_dir(),
                &[
                    ("webhook.service.type", json!(kind)),
                    ("webhook.allowExternal", json!(true)),
                ],
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            allowed["Service kube-system/oxide-controller-webhook"]["spec"]["type"],
            kind
        );
    }
}

#[test]
fn the_webhook_serves_its_probes_and_the_service_reaches_it() {
    for (side, objects) in both_sides() {
        let deployment = &objects["Deployment kube-system/oxide-controller-webhook"]["spec"];
        let pod_labels = &deployment["template"]["metadata"]["labels"];
        assert_eq!(&deployment["selector"]["matchLabels"], pod_labels, "{side}");
        assert_eq!(
            pod_labels["app.kubernetes.io/component"], "webhook",
            "{side}"
        );

        let c = &deployment["template"]["spec"]["containers"][0];
        assert_eq!(c["command"], json!(["/usr/local/bin/scale"]), "{side}");
        assert_eq!(
            c["args"],
            json!([
                "serve",
                "--listen",
                "0.0.0.0:8443",
                "--secrets-dir",
                "/var/run/secrets/oxide-controller",
                "--tls-cert",
                "/var/run/secrets/oxide-controller-tls/tls.crt",
                "--tls-key",
                "/var/run/secrets/oxide-controller-tls/tls.key"
            ]),
            "{side}"
        );
        assert_eq!(
            c["ports"],
            json!([{"name": "https", "containerPort": 8443, "protocol": "TCP"}]),
            "{side}"
        );
        assert_eq!(
            c["readinessProbe"]["httpGet"],
            json!({"path": "/readyz", "port": "https", "scheme": "HTTPS"}),
            "{side}"
        );
        assert_eq!(
            c["livenessProbe"]["httpGet"],
            json!({"path": "/healthz", "port": "https", "scheme": "HTTPS"}),
            "{side}"
        );

        let service = &objects["Service kube-system/oxide-controller-webhook"]["spec"];
        assert_eq!(&service["selector"], pod_labels, "{side}");
        assert_eq!(service["type"], "ClusterIP", "{side}");
        assert_eq!(
            service["ports"],
            json!([{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]),
            "{side}"
        );
    }
}

/// `version = "…"` of a Cargo.toml's `[package]`.
fn crate_version(manifest: &Path) -> String {
    read(manifest)
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or_else(|| panic!("no version in {}", manifest.display()))
        .to_owned()
}

#[test]
fn the_default_image_is_the_release_of_these_binaries() {
    let version = crate_version(&repo_root().join("functions/reconcile-once/Cargo.toml"));
    for binary in BINARIES {
        let manifest = repo_root().join(format!("functions/{binary}/Cargo.toml"));
        assert_eq!(
            crate_version(&manifest),
            version,
            "{binary} is released with the others"
        );
    }
    let chart = parse_yaml(&read(&chart_dir().join("Chart.yaml")), "Chart.yaml").unwrap();
    assert_eq!(
        chart["appVersion"],
        version.as_str(),
        "Chart.yaml appVersion"
    );
    let image = format!("{IMAGE_REPOSITORY}:{version}");
    for (side, objects) in both_sides() {
        let mut specs = Vec::new();
        for (key, object) in &objects {
            pod_specs(key.clone(), object, &mut specs);
        }
        for (at, spec) in specs {
            assert_eq!(
                spec["containers"][0]["image"],
                image.as_str(),
                "{side} {at}"
            );
        }
    }
}

#[test]
fn the_image_holds_every_binary_the_manifests_run() {
    let dockerfile = read(&repo_root().join("Dockerfile"));
    for binary in BINARIES {
        assert!(
            dockerfile.contains(&format!("-p {binary}"))
                && dockerfile.contains(&format!("target/release/{binary}")),
            "the Dockerfile builds and installs {binary}"
        );
    }
    assert!(dockerfile.contains("COPY --from=build /out/ /usr/local/bin/"));
    assert!(
        dockerfile.contains("USER 65532:65532"),
        "the image runs as the manifests' user"
    );
}

#[test]
fn every_plain_manifest_is_one_object_per_document_in_our_namespaces() {
    let names: Vec<String> = fs::read_dir(plain_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
        .collect();
    let mut names = names;
    names.sort();
    let mut want: Vec<&str> = PLAIN_FILES.to_vec();
    want.sort();
    assert_eq!(names, want, "bootstrap embeds exactly these files");
    for doc in plain_documents(&plain_dir()).unwrap() {
        let key = object_key(&doc).unwrap();
        assert!(
            !doc["kind"].as_str().unwrap().ends_with("List"),
            "{key}: one object per document"
        );
        assert_eq!(
            doc["metadata"]["labels"]["app.kubernetes.io/name"], "oxide-controller",
            "{key}"
        );
        let cluster_scoped = matches!(
            doc["kind"].as_str(),
            Some(
                "ClusterRole"
                    | "ClusterRoleBinding"
                    | "Namespace"
                    | "ValidatingAdmissionPolicy"
                    | "ValidatingAdmissionPolicyBinding"
            )
        );
        if !cluster_scoped {
            assert!(
                matches!(
                    doc["metadata"]["namespace"].as_str(),
                    Some("kube-system" | "oxide-controller-jobs" | "oxide-controller-backup")
                ) || key == "Role default/oxide-controller-reconcile-certificates"
                    || key == "RoleBinding default/oxide-controller-reconcile-certificates",
                "{key} (only the Role to list k3s's certificate monitor Events, which k3s writes in default, is elsewhere)"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What the operator is told (issue 46 item 5): the monitoring objects.

/// What a cluster with the Prometheus Operator serves (`--api-versions`).
const MONITORING_APIS: [&str; 3] = [
    "monitoring.coreos.com/v1",
    "monitoring.coreos.com/v1/PrometheusRule",
    "monitoring.coreos.com/v1/ServiceMonitor",
];
const MONITORING_OBJECTS: [&str; 3] = [
    "ConfigMap kube-system/oxide-controller-dashboard",
    "PrometheusRule kube-system/oxide-controller",
    "ServiceMonitor kube-system/oxide-controller-webhook",
];

fn chart_objects(set: &[(&str, Value)], apis: &[&str]) -> BTreeMap<String, Value> {
    by_key(&render_chart_for(&chart_dir(), set, apis).unwrap()).unwrap()
}

/// The objects beyond [`EXPECTED_OBJECTS`].
fn monitoring_objects(set: &[(&str, Value)], apis: &[&str]) -> BTreeMap<String, Value> {
    chart_objects(set, apis)
        .into_iter()
        .filter(|(k, _)| !EXPECTED_OBJECTS.contains(&k.as_str()))
        .collect()
}

fn chart_file(name: &str) -> String {
    read(&chart_dir().join("files").join(name))
}

#[test]
fn the_monitoring_objects_render_where_the_prometheus_operator_is_and_not_otherwise() {
    assert!(
        monitoring_objects(&[], &[]).is_empty(),
        "no CRDs, no objects"
    );
    let all = monitoring_objects(&[], &MONITORING_APIS);
    assert_eq!(all.keys().collect::<Vec<_>>(), MONITORING_OBJECTS);
    // The rest of the chart does not change with them.
    let base = chart_objects(&[], &[]);
    let with = chart_objects(&[], &MONITORING_APIS);
    for key in EXPECTED_OBJECTS {
        assert_eq!(base[key], with[key], "{key}");
    }
    // Each has its switch.
    for (value, object) in [
        ("monitoring.grafanaDashboard.enabled", MONITORING_OBJECTS[0]),
        ("monitoring.prometheusRule.enabled", MONITORING_OBJECTS[1]),
        ("monitoring.serviceMonitor.enabled", MONITORING_OBJECTS[2]),
    ] {
        let left = monitoring_objects(&[(value, json!(false))], &MONITORING_APIS);
        assert_eq!(left.len(), 2, "{value}");
        assert!(
            !left.contains_key(object),
            "{value} false still renders {object}"
        );
    }
    // A kind's CRD alone: only that kind (the dashboard goes with the group).
    let rule_only = monitoring_objects(&[], &["monitoring.coreos.com/v1/PrometheusRule"]);
    assert_eq!(
        rule_only.keys().collect::<Vec<_>>(),
        [MONITORING_OBJECTS[1]]
    );
}

#[test]
fn the_prometheus_rule_is_the_rules_file_promtool_checks() {
    let objects = monitoring_objects(
        &[(
            "monitoring.prometheusRule.labels",
            json!({"release": "kps"}),
        )],
        &MONITORING_APIS,
    );
    let rule = &objects["PrometheusRule kube-system/oxide-controller"];
    let file = normalize(&parse_yaml(&chart_file("rules.yaml"), "rules.yaml").unwrap());
    assert_eq!(Some(rule["spec"].clone()), file);
    assert_eq!(
        rule["metadata"]["labels"],
        json!({"app.kubernetes.io/name": "oxide-controller", "release": "kps"})
    );
}

#[test]
fn the_service_monitor_scrapes_the_webhook_service_from_namespaces_the_policy_admits() {
    let objects = chart_objects(
        &[("monitoring.scrapeNamespaces", json!(["monitoring"]))],
        &MONITORING_APIS,
    );
    let monitor = &objects["ServiceMonitor kube-system/oxide-controller-webhook"]["spec"];
    let service = &objects["Service kube-system/oxide-controller-webhook"];
    for (k, v) in monitor["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &service["metadata"]["labels"][k], v,
            "selects the Service by {k}"
        );
    }
    assert_eq!(
        monitor["namespaceSelector"],
        json!({"matchNames": ["kube-system"]})
    );
    let endpoint = &monitor["endpoints"][0];
    assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
    assert_eq!(
        (&endpoint["scheme"], &endpoint["path"]),
        (&json!("https"), &json!("/metrics"))
    );
    assert!(
        endpoint.get("bearerTokenSecret").is_none() && endpoint.get("authorization").is_none(),
        "/metrics wants no token, so the scraper reads no key of the state Secret"
    );
    let policy = &objects["NetworkPolicy kube-system/oxide-controller-webhook"]["spec"];
    assert_eq!(
        policy["ingress"],
        json!([{"from": [{"namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}]}}],
            "ports": [{"protocol": "TCP", "port": "https"}]}]),
        "the scraping namespace reaches the https port, and nothing else is admitted"
    );
    // Both lists: two rules.
    let both = chart_objects(
        &[
            ("monitoring.scrapeNamespaces", json!(["monitoring"])),
            ("webhook.clientNamespaces", json!(["ci"])),
        ],
        &[],
    );
    assert_eq!(
        both["NetworkPolicy kube-system/oxide-controller-webhook"]["spec"]["ingress"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
}

#[test]
fn the_dashboard_is_grafana_json_for_the_sidecar() {
    let objects = monitoring_objects(&[], &MONITORING_APIS);
    let map = &objects["ConfigMap kube-system/oxide-controller-dashboard"];
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    let text = map["data"]["oxide-controller.json"].as_str().unwrap();
    let dashboard: Value = serde_json::from_str(text).unwrap();
    assert_eq!(
        dashboard,
        serde_json::from_str::<Value>(&chart_file("dashboard.json")).unwrap()
    );
    assert_eq!(dashboard["uid"], "oxide-controller");
    let panels = dashboard["panels"].as_array().unwrap();
    let queries: Vec<&str> = panels
        .iter()
        .filter_map(|p| p["targets"].as_array())
        .flatten()
        .map(|t| t["expr"].as_str().unwrap())
        .collect();
    assert!(queries.len() > 10, "{queries:?}");
    // Every query about the cluster keeps to the cluster chosen on the dashboard.
    for q in queries
        .iter()
        .filter(|q| !q.contains("oxide_controller_webhook_") && !q.contains("triggers_total"))
    {
        assert!(q.contains(r#"cluster="$cluster""#), "{q}");
    }
}

/// Names of `oxide_controller_*` metrics in `text`.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    text.match_indices("oxide_controller_")
        .map(|(i, _)| {
            text[i..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect()
        })
        .collect()
}

/// Every name the webhook serves: its own metrics and the cluster's, with every optional part
/// present (histograms with their `_bucket`, `_sum` and `_count` series).
fn served_metric_names() -> std::collections::BTreeSet<String> {
    use chrono::{DateTime, Duration, Utc};
    use oxide_controller::domain::plan::PoolCounts;
    use oxide_controller::domain::upgrade::Phase;
    use oxide_controller::webhook::metrics::cluster::{
        self, BackupInput, CertificateExpiry, ConditionInput, DrillInput, Input, MaintenanceInput,
        UpgradeInput,
    };
    let t = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
    let input = Input {
        cluster: "demo".into(),
        status_up: true,
        reconcile_interval: Some(Duration::minutes(5)),
        last_run_started: Some(t),
        last_run_finished: Some(t),
        last_converged: Some(t),
        conditions: vec![ConditionInput {
            type_: "Ready".into(),
            status: true,
            reason: "Converged".into(),
            last_transition: t,
        }],
        pools: vec![PoolCounts {
            pool: "workers".into(),
            ..PoolCounts::default()
        }],
        findings: 0,
        backup: Some(BackupInput {
            scheduled: true,
            last_success: Some(t),
            last_success_bytes: Some(1),
            last_attempt: Some(t),
            last_attempt_failed: false,
            stale: false,
        }),
        upgrade: Some(UpgradeInput {
            from: "a".into(),
            to: "b".into(),
            phase: Phase::Workers,
            started: t,
            blockers: 0,
        }),
        certificates: Some(vec![CertificateExpiry {
            pool: "workers".into(),
            not_after: t,
        }]),
        drill: Some(DrillInput {
            last: Some(t),
            last_success: Some(true),
            overdue: false,
        }),
        maintenance: Some(MaintenanceInput {
            next_window: Some(t),
            waiting_release: Some("v".into()),
        }),
        oxide_token_expiry: Some(t),
    };
    let webhook = oxide_controller::webhook::metrics::Metrics::default();
    webhook.observe(0, "GET", 200, std::time::Duration::from_millis(1));
    let text = webhook.render() + &cluster::render(&input);
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            names.insert(name.to_owned());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    names
}

#[test]
fn the_alerts_and_the_dashboard_use_only_metrics_the_webhook_serves() {
    let served = served_metric_names();
    assert!(served.contains("oxide_controller_condition"), "{served:?}");
    for file in ["rules.yaml", "dashboard.json"] {
        let used = metric_names(&chart_file(file));
        assert!(!used.is_empty(), "{file}");
        let unknown: Vec<_> = used.difference(&served).collect();
        assert!(
            unknown.is_empty(),
            "{file} uses metrics the webhook does not serve: {unknown:?}"
        );
    }
}

#[test]
fn every_alert_has_a_promtool_test_where_it_fires_and_one_where_it_does_not() {
    let rules = parse_yaml(&chart_file("rules.yaml"), "rules.yaml").unwrap();
    let alerts: Vec<&str> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert!(alerts.len() >= 10, "{alerts:?}");
    let path = repo_root().join("tests/monitoring/rules_test.yaml");
    let tests = parse_yaml(&read(&path), "rules_test.yaml").unwrap();
    assert_eq!(
        tests["rule_files"],
        json!(["../../charts/oxide-controller/files/rules.yaml"])
    );
    let cases: Vec<(&str, bool)> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .map(|c| {
            let fires = c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
            (c["alertname"].as_str().unwrap(), fires)
        })
        .collect();
    for alert in alerts {
        for fires in [true, false] {
            assert!(
                cases.contains(&(alert, fires)),
                "{alert} has no case where it {}",
                if fires { "fires" } else { "stays quiet" }
            );
        }
    }
}

#[test]
fn the_renderer_reads_files_and_capabilities_as_helm_does() {
    let values = json!({"on": true});
    let chart = json!({"appVersion": "1"});
    let dir = chart_dir();
    let scope = Scope {
        values: &values,
        chart: &chart,
        api_versions: &["monitoring.coreos.com/v1"],
        files: Some(&dir),
    };
    let cases: &[(&str, &str)] = &[
        (
            "{{ if .Capabilities.APIVersions.Has \"monitoring.coreos.com/v1\" }}y{{ else }}n{{ end }}",
            "y",
        ),
        (
            "{{ if .Capabilities.APIVersions.Has \"monitoring.coreos.com/v1/ServiceMonitor\" }}y{{ else }}n{{ end }}",
            "n",
        ),
        (
            "{{ if and .Values.on (.Capabilities.APIVersions.Has \"monitoring.coreos.com/v1\") }}y{{ end }}",
            "y",
        ),
        ("x:\n  {{- .Files.Get \"Chart.yaml\" | nindent 2 }}", ""),
    ];
    for (src, want) in cases {
        let got = render_template_in(src, &scope).unwrap();
        if src.contains("Files.Get") {
            let parsed: Value = serde_saphyr::from_str(&got).unwrap();
            assert_eq!(parsed["x"]["name"], "oxide-controller", "{got}");
        } else {
            assert_eq!(&got, want, "{src:?}");
        }
    }
    for (src, want) in [
        ("{{ .Files.Get \"no-such-file\" }}", "no-such-file"),
        ("{{ .Files.Get files }}", "wants a string"),
        (
            "{{ if .Capabilities.APIVersions.Has }}x{{ end }}",
            "wants one string",
        ),
    ] {
        let err = render_template_in(src, &scope).unwrap_err();
        assert!(err.contains(want), "{src:?}: {err}");
    }
    let err = render_template("{{ .Files.Get \"Chart.yaml\" }}", &values, &chart).unwrap_err();
    assert!(err.contains("without a chart"), "{err}");
}
