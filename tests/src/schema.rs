//! A small JSON Schema checker for the subset our committed schemas use (type, enum, required,
//! properties, additionalProperties, items, oneOf, $ref to #/$defs, minimum). Enough to keep
//! `docs/lock-status.schema.json` and the real output in step without a heavy dependency.

use serde_json::Value;

/// Every violation of `schema` by `value`, as `path: problem` lines (empty = valid).
pub fn violations(schema: &Value, value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    check(schema, schema, value, "$", &mut out);
    out
}

fn type_ok(t: &str, v: &Value) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => false,
    }
}

fn check(root: &Value, schema: &Value, v: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.trim_start_matches("#/$defs/");
        match root["$defs"].get(name) {
            Some(s) => check(root, s, v, path, out),
            None => out.push(format!("{path}: unknown $ref {r}")),
        }
        return;
    }
    if let Some(options) = schema.get("oneOf").and_then(Value::as_array) {
        let matching = options
            .iter()
            .filter(|o| {
                let mut e = Vec::new();
                check(root, o, v, path, &mut e);
                e.is_empty()
            })
            .count();
        if matching != 1 {
            out.push(format!("{path}: matches {matching} of oneOf, want 1: {v}"));
        }
        return;
    }
    match schema.get("type") {
        Some(Value::String(t)) if !type_ok(t, v) => {
            out.push(format!("{path}: want {t}, got {v}"));
            return;
        }
        Some(Value::Array(ts)) if !ts.iter().filter_map(Value::as_str).any(|t| type_ok(t, v)) => {
            out.push(format!("{path}: want one of {ts:?}, got {v}"));
            return;
        }
        _ => {}
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array)
        && !e.contains(v)
    {
        out.push(format!("{path}: {v} not in {e:?}"));
    }
    if let (Some(min), Some(n)) = (schema.get("minimum").and_then(Value::as_f64), v.as_f64())
        && n < min
    {
        out.push(format!("{path}: {n} < minimum {min}"));
    }
    if let Some(obj) = v.as_object() {
        for r in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(k) = r.as_str()
                && !obj.contains_key(k)
            {
                out.push(format!("{path}: missing required {k}"));
            }
        }
        let props = schema.get("properties").and_then(Value::as_object);
        for (k, val) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(s) => check(root, s, val, &format!("{path}.{k}"), out),
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    out.push(format!("{path}: unexpected property {k}"))
                }
                None => {}
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), v.as_array()) {
        for (i, item) in arr.iter().enumerate() {
            check(root, items, item, &format!("{path}[{i}]"), out);
        }
    }
}
