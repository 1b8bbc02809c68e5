//! A small validator for the OpenAPI 3.0 document of the Oxide API, covering the subset of
//! JSON Schema the document uses: `$ref`, `type`, `nullable`, `enum`, `properties`,
//! `required`, `additionalProperties`, `items`, `minItems`/`maxItems`, `oneOf`/`anyOf`/`allOf`,
//! `format` (uuid, date-time, ip, ipv4, ipv6, byte, integer widths), `minimum`/`maximum`,
//! `minLength`/`maxLength` and `pattern` (ECMAScript, via `regress`).
//!
//! Used by the conformance test to check that every route the simulator serves exists in the
//! official document with the same success status and that bodies match its schemas.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use base64::Engine;
use serde_json::Value;

/// Nesting depth after which validation gives up (guards against `$ref` cycles).
const MAX_DEPTH: usize = 96;

/// A parsed OpenAPI document.
#[derive(Debug)]
pub struct OpenApiDoc {
    root: Value,
}

/// One operation parameter.
#[derive(Debug, Clone)]
pub struct Param {
    /// `path` or `query`.
    pub location: String,
    pub name: String,
    pub required: bool,
    pub schema: Value,
}

impl OpenApiDoc {
    /// Reads and parses the document at `path`.
    pub fn from_path(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let root: Value =
            serde_json::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))?;
        Ok(Self::from_value(root))
    }

    /// Wraps an already parsed document.
    pub fn from_value(root: Value) -> Self {
        Self { root }
    }

    /// `info.version`.
    pub fn version(&self) -> Option<&str> {
        self.root.pointer("/info/version").and_then(Value::as_str)
    }

    /// The operation object for `method` (any case) on `template`.
    pub fn operation(&self, method: &str, template: &str) -> Option<&Value> {
        self.root
            .get("paths")?
            .get(template)?
            .get(method.to_ascii_lowercase())
    }

    /// The methods the document has for `template`, upper case, sorted.
    pub fn methods(&self, template: &str) -> Vec<String> {
        const METHODS: &[&str] = &[
            "delete", "get", "head", "options", "patch", "post", "put", "trace",
        ];
        let Some(item) = self.root.get("paths").and_then(|p| p.get(template)) else {
            return Vec::new();
        };
        METHODS
            .iter()
            .filter(|m| item.get(**m).is_some())
            .map(|m| m.to_ascii_uppercase())
            .collect()
    }

    /// The operation's single 2xx status.
    pub fn success_status(&self, method: &str, template: &str) -> Option<u16> {
        let responses = self
            .operation(method, template)?
            .get("responses")?
            .as_object()?;
        let mut ok = responses
            .keys()
            .filter_map(|k| k.parse::<u16>().ok())
            .filter(|s| (200..300).contains(s));
        let first = ok.next()?;
        ok.next().is_none().then_some(first)
    }

    /// Schema of the JSON request body, if the operation takes one.
    pub fn request_schema(&self, method: &str, template: &str) -> Option<&Value> {
        self.operation(method, template)?
            .pointer("/requestBody/content/application~1json/schema")
    }

    /// Schema of the JSON response body for `status` (2xx: the declared response; 4xx/5xx:
    /// the `4XX`/`5XX` entries, resolved through `components/responses`).
    pub fn response_schema(&self, method: &str, template: &str, status: u16) -> Option<&Value> {
        let responses = self.operation(method, template)?.get("responses")?;
        let class = format!("{}XX", status / 100);
        let resp = responses
            .get(status.to_string())
            .or_else(|| responses.get(&class))?;
        let resp = match resp.get("$ref").and_then(Value::as_str) {
            Some(r) => self.resolve(r)?,
            None => resp,
        };
        resp.pointer("/content/application~1json/schema")
    }

    /// The operation's parameters.
    pub fn parameters(&self, method: &str, template: &str) -> Vec<Param> {
        self.operation(method, template)
            .and_then(|op| op.get("parameters"))
            .and_then(Value::as_array)
            .map(|ps| {
                ps.iter()
                    .map(|p| Param {
                        location: p.get("in").and_then(Value::as_str).unwrap_or("").into(),
                        name: p.get("name").and_then(Value::as_str).unwrap_or("").into(),
                        required: p.get("required").and_then(Value::as_bool).unwrap_or(false),
                        schema: p.get("schema").cloned().unwrap_or(Value::Bool(true)),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Resolves a local `#/...` reference.
    pub fn resolve(&self, reference: &str) -> Option<&Value> {
        self.root.pointer(reference.strip_prefix('#')?)
    }

    /// Validates `value` against `schema`; returns the problems found (empty when valid).
    pub fn validate(&self, schema: &Value, value: &Value) -> Vec<String> {
        let mut errs = Vec::new();
        self.check(schema, value, "$", &mut errs, 0);
        errs
    }

    /// Validates a query/path parameter given as a string: it is coerced to the schema's
    /// type (integer, boolean) before validation.
    pub fn validate_param(&self, schema: &Value, raw: &str) -> Vec<String> {
        let resolved = self.deref(schema);
        let ty = resolved.get("type").and_then(Value::as_str);
        let value = match ty {
            Some("integer") => match raw.parse::<i128>() {
                Ok(n) if n >= 0 => raw.parse::<u64>().map(Value::from).unwrap_or(Value::Null),
                Ok(_) => raw.parse::<i64>().map(Value::from).unwrap_or(Value::Null),
                Err(_) => return vec![format!("$: {raw:?} is not an integer")],
            },
            Some("boolean") => match raw {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => return vec![format!("$: {raw:?} is not a boolean")],
            },
            _ => Value::String(raw.to_owned()),
        };
        self.validate(schema, &value)
    }

    fn deref<'a>(&'a self, mut schema: &'a Value) -> &'a Value {
        for _ in 0..MAX_DEPTH {
            match schema
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| self.resolve(r))
            {
                Some(next) => schema = next,
                None => break,
            }
        }
        schema
    }

    fn check(&self, schema: &Value, v: &Value, path: &str, errs: &mut Vec<String>, depth: usize) {
        if depth > MAX_DEPTH {
            errs.push(format!("{path}: schema nesting too deep"));
            return;
        }
        let Some(s) = schema.as_object() else {
            if schema == &Value::Bool(false) {
                errs.push(format!("{path}: no value allowed"));
            }
            return;
        };
        if let Some(r) = s.get("$ref").and_then(Value::as_str) {
            match self.resolve(r) {
                Some(target) => self.check(target, v, path, errs, depth + 1),
                None => errs.push(format!("{path}: unresolvable $ref {r}")),
            }
            return;
        }
        if v.is_null() && s.get("nullable").and_then(Value::as_bool) == Some(true) {
            return;
        }
        if let Some(all) = s.get("allOf").and_then(Value::as_array) {
            for sub in all {
                self.check(sub, v, path, errs, depth + 1);
            }
        }
        if let Some(any) = s.get("anyOf").and_then(Value::as_array) {
            let branch_errs: Vec<Vec<String>> = any
                .iter()
                .map(|sub| self.sub(sub, v, path, depth))
                .collect();
            if !branch_errs.iter().any(Vec::is_empty) {
                errs.push(format!(
                    "{path}: matches none of anyOf: {}",
                    summarize(&branch_errs)
                ));
            }
        }
        if let Some(one) = s.get("oneOf").and_then(Value::as_array) {
            let branch_errs: Vec<Vec<String>> = one
                .iter()
                .map(|sub| self.sub(sub, v, path, depth))
                .collect();
            let matched = branch_errs.iter().filter(|e| e.is_empty()).count();
            if matched != 1 {
                errs.push(format!(
                    "{path}: matches {matched} branches of oneOf (need exactly 1): {}",
                    summarize(&branch_errs)
                ));
            }
        }
        if let Some(values) = s.get("enum").and_then(Value::as_array)
            && !values.contains(v)
        {
            errs.push(format!(
                "{path}: {v} is not one of {}",
                Value::Array(values.clone())
            ));
        }
        if let Some(ty) = s.get("type").and_then(Value::as_str)
            && !type_matches(ty, v)
        {
            errs.push(format!("{path}: expected {ty}, got {}", kind_of(v)));
            return;
        }
        let format = s.get("format").and_then(Value::as_str);
        match v {
            Value::String(text) => self.check_string(s, format, text, path, errs),
            Value::Number(_) => check_number(s, format, v, path, errs),
            Value::Array(items) => {
                let len = items.len() as u64;
                if let Some(min) = s.get("minItems").and_then(Value::as_u64)
                    && len < min
                {
                    errs.push(format!("{path}: fewer than {min} items"));
                }
                if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
                    && len > max
                {
                    errs.push(format!("{path}: more than {max} items"));
                }
                if let Some(item_schema) = s.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        self.check(item_schema, item, &format!("{path}[{i}]"), errs, depth + 1);
                    }
                }
            }
            Value::Object(map) => {
                let props = s.get("properties").and_then(Value::as_object);
                if let Some(required) = s.get("required").and_then(Value::as_array) {
                    for key in required.iter().filter_map(Value::as_str) {
                        if !map.contains_key(key) {
                            errs.push(format!("{path}: missing required property {key:?}"));
                        }
                    }
                }
                for (key, val) in map {
                    let child = format!("{path}.{key}");
                    match props.and_then(|p| p.get(key)) {
                        Some(prop) => self.check(prop, val, &child, errs, depth + 1),
                        None => match s.get("additionalProperties") {
                            Some(Value::Bool(false)) => {
                                errs.push(format!("{path}: unexpected property {key:?}"));
                            }
                            Some(extra @ Value::Object(_)) => {
                                self.check(extra, val, &child, errs, depth + 1);
                            }
                            _ => {}
                        },
                    }
                }
            }
            Value::Bool(_) | Value::Null => {}
        }
    }

    fn sub(&self, schema: &Value, v: &Value, path: &str, depth: usize) -> Vec<String> {
        let mut e = Vec::new();
        self.check(schema, v, path, &mut e, depth + 1);
        e
    }

    fn check_string(
        &self,
        s: &serde_json::Map<String, Value>,
        format: Option<&str>,
        text: &str,
        path: &str,
        errs: &mut Vec<String>,
    ) {
        let chars = text.chars().count() as u64;
        if let Some(min) = s.get("minLength").and_then(Value::as_u64)
            && chars < min
        {
            errs.push(format!("{path}: shorter than {min} characters"));
        }
        if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
            && chars > max
        {
            errs.push(format!("{path}: longer than {max} characters"));
        }
        if let Some(pattern) = s.get("pattern").and_then(Value::as_str) {
            match regress::Regex::new(pattern) {
                Ok(re) => {
                    if re.find(text).is_none() {
                        errs.push(format!("{path}: {text:?} does not match {pattern:?}"));
                    }
                }
                Err(e) => errs.push(format!("{path}: bad pattern {pattern:?}: {e}")),
            }
        }
        let ok = match format {
            Some("uuid") => uuid::Uuid::try_parse(text).is_ok() && text.len() == 36,
            Some("date-time") => chrono::DateTime::parse_from_rfc3339(text).is_ok(),
            Some("ip") => text.parse::<IpAddr>().is_ok(),
            Some("ipv4") => text.parse::<Ipv4Addr>().is_ok(),
            Some("ipv6") => text.parse::<Ipv6Addr>().is_ok(),
            Some("byte") => base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .is_ok(),
            _ => true,
        };
        if !ok {
            errs.push(format!(
                "{path}: {text:?} is not a valid {}",
                format.unwrap_or("string")
            ));
        }
    }
}

fn check_number(
    s: &serde_json::Map<String, Value>,
    format: Option<&str>,
    v: &Value,
    path: &str,
    errs: &mut Vec<String>,
) {
    let as_f = v.as_f64().unwrap_or(f64::NAN);
    if let Some(min) = s.get("minimum").and_then(Value::as_f64)
        && as_f < min
    {
        errs.push(format!("{path}: {v} is below the minimum {min}"));
    }
    if let Some(max) = s.get("maximum").and_then(Value::as_f64)
        && as_f > max
    {
        errs.push(format!("{path}: {v} is above the maximum {max}"));
    }
    let range: Option<(i128, i128)> = match format {
        Some("uint8") => Some((0, u8::MAX.into())),
        Some("uint16") => Some((0, u16::MAX.into())),
        Some("uint32") => Some((0, u32::MAX.into())),
        Some("uint64" | "uint") => Some((0, u64::MAX.into())),
        Some("int8") => Some((i8::MIN.into(), i8::MAX.into())),
        Some("int16") => Some((i16::MIN.into(), i16::MAX.into())),
        Some("int32") => Some((i32::MIN.into(), i32::MAX.into())),
        Some("int64") => Some((i64::MIN.into(), i64::MAX.into())),
        _ => None,
    };
    if let Some((lo, hi)) = range {
        let n = v
            .as_u64()
            .map(i128::from)
            .or_else(|| v.as_i64().map(i128::from));
        match n {
            Some(n) if (lo..=hi).contains(&n) => {}
            _ => errs.push(format!("{path}: {v} does not fit {}", format.unwrap_or(""))),
        }
    }
}

fn type_matches(ty: &str, v: &Value) -> bool {
    match ty {
        "string" => v.is_string(),
        "integer" => v.is_u64() || v.is_i64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "null" => v.is_null(),
        _ => true,
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn summarize(branches: &[Vec<String>]) -> String {
    branches
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let first = e.first().map(String::as_str).unwrap_or("ok");
            format!("[{i}] {first}")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc() -> OpenApiDoc {
        OpenApiDoc::from_value(json!({
            "components": {"schemas": {
                "Name": {"type": "string", "maxLength": 63,
                    "pattern": "^(?![0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)^[a-z]([a-z0-9-]*[a-z0-9])?$"},
                "NameOrId": {"oneOf": [
                    {"title": "id", "allOf": [{"type": "string", "format": "uuid"}]},
                    {"title": "name", "allOf": [{"$ref": "#/components/schemas/Name"}]}
                ]},
                "Thing": {"type": "object", "properties": {
                    "name": {"$ref": "#/components/schemas/Name"},
                    "n": {"type": "integer", "format": "uint16", "minimum": 1},
                    "at": {"type": "string", "format": "date-time"},
                    "ip": {"nullable": true, "type": "string", "format": "ip"},
                    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}
                }, "required": ["name", "n"], "additionalProperties": false}
            }}
        }))
    }

    #[test]
    fn accepts_valid_and_reports_each_violation() {
        let d = doc();
        let thing = json!({"$ref": "#/components/schemas/Thing"});
        let ok = json!({"name": "web-1", "n": 3, "at": "2026-01-01T00:00:00Z", "ip": null, "tags": ["a"]});
        assert_eq!(d.validate(&thing, &ok), Vec::<String>::new());
        let bad = json!({"name": "Web", "n": 70000, "at": "yesterday", "ip": "1.2.3", "tags": ["c"], "x": 1});
        let errs = d.validate(&thing, &bad);
        for needle in [
            "does not match",
            "uint16",
            "date-time",
            "valid ip",
            "not one of",
            "unexpected property",
        ] {
            assert!(
                errs.iter().any(|e| e.contains(needle)),
                "{needle}: {errs:?}"
            );
        }
        assert!(
            d.validate(&thing, &json!({"name": "a"}))
                .iter()
                .any(|e| e.contains("missing required"))
        );
        assert!(
            d.validate(&thing, &json!({"name": "a", "n": 0}))
                .iter()
                .any(|e| e.contains("minimum"))
        );
    }

    #[test]
    fn one_of_needs_exactly_one_branch() {
        let d = doc();
        let s = json!({"$ref": "#/components/schemas/NameOrId"});
        assert!(d.validate(&s, &json!("abc")).is_empty());
        // A UUID matches only the id branch (the name pattern excludes UUIDs), whichever
        // character it starts with.
        for _ in 0..64 {
            assert!(
                d.validate(&s, &json!(uuid::Uuid::new_v4().to_string()))
                    .is_empty()
            );
        }
        assert!(!d.validate(&s, &json!("ABC")).is_empty());
        assert!(!d.validate(&s, &json!(5)).is_empty());
    }

    #[test]
    fn parameters_are_coerced_from_strings() {
        let d = doc();
        let s = json!({"nullable": true, "type": "integer", "format": "uint32", "minimum": 1});
        assert!(d.validate_param(&s, "10").is_empty());
        assert!(!d.validate_param(&s, "0").is_empty());
        assert!(!d.validate_param(&s, "ten").is_empty());
    }
}
