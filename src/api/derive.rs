//! `idem_key` and `idem_fingerprint`: the key and request fingerprint a client derives from a
//! message, computed the same way here and in every client library (clients/*), so a producer, a
//! consumer and the database agree without sharing code. The encodings are the contract: changing
//! one changes every key ever derived, so they are pinned by tests/regress/sql/derive.sql.
use super::args;
use crate::errors;
use crate::storage::Document;
use pgrx::prelude::*;
use sha2::{Digest, Sha256};

/// The name bytes of a version-5 UUID: each part as `<UTF-8 length>:<bytes>;`. Length prefixes
/// keep parts apart whatever they contain (`["a;b"]` and `["a", "b"]` differ).
pub fn key_name(parts: &[&str]) -> Vec<u8> {
    let mut name = Vec::with_capacity(parts.iter().map(|p| p.len() + 8).sum());
    for part in parts {
        name.extend_from_slice(part.len().to_string().as_bytes());
        name.push(b':');
        name.extend_from_slice(part.as_bytes());
        name.push(b';');
    }
    name
}

pub fn key(namespace: uuid::Uuid, parts: &[&str]) -> String {
    uuid::Uuid::new_v5(&namespace, &key_name(parts)).hyphenated().to_string()
}

/// What the fingerprint hashes: the whole document, or an object of each JSON Pointer given
/// (as written) to the value there, JSON null where there is none.
pub fn fingerprint_subject(document: serde_json::Value, paths: &[&str]) -> Result<serde_json::Value, String> {
    if paths.is_empty() {
        return Ok(document);
    }
    let mut picked = serde_json::Map::new();
    for path in paths {
        if !path.is_empty() && !path.starts_with('/') {
            return Err(format!(
                "path {path:?} is not a JSON Pointer (RFC 6901): it must be empty or start with '/'"
            ));
        }
        let value = document.pointer(path).cloned().unwrap_or(serde_json::Value::Null);
        picked.insert((*path).to_string(), value);
    }
    Ok(serde_json::Value::Object(picked))
}

/// The deepest nesting of arrays and objects a document may have for a fingerprint, here and in the client
/// libraries (the same constant there): deeper documents are refused with 54000 before they are parsed, so
/// that no parser or canonicalizer recurses without bound (serde_json itself stops at 128).
pub const MAX_DEPTH: usize = 100;

/// How deeply arrays and objects nest in a JSON text (0 for a scalar, 1 for `[]`), counted in one pass
/// without recursion.
pub fn depth(json: &str) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in json.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

pub fn fingerprint(document: serde_json::Value, paths: &[&str]) -> Result<String, String> {
    let subject = fingerprint_subject(document, paths)?;
    let canonical = serde_json_canonicalizer::to_vec(&subject).map_err(|e| e.to_string())?;
    Ok(Sha256::digest(&canonical).iter().map(|b| format!("{b:02x}")).collect())
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_key.sql",
    name = "idem_key_surface",
    requires = [idem_key]
);

#[pg_extern(immutable, parallel_safe)]
fn idem_key(namespace: Option<pgrx::Uuid>, parts: Option<pgrx::VariadicArray<'_, &str>>) -> String {
    let Some(namespace) = namespace else { errors::null_argument("namespace") };
    let Some(parts) = parts else { errors::null_argument("parts") };
    let parts: Vec<&str> = parts.iter().map(|p| p.unwrap_or_else(|| errors::null_argument("part"))).collect();
    if parts.is_empty() {
        errors::invalid("idem_key needs at least one part".to_string());
    }
    key(uuid::Uuid::from_bytes(*namespace.as_bytes()), &parts)
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_fingerprint.sql",
    name = "idem_fingerprint_surface",
    requires = [idem_fingerprint]
);

#[pg_extern(immutable, parallel_safe)]
fn idem_fingerprint(
    document: Option<Document>,
    paths: default!(Option<pgrx::VariadicArray<'_, &str>>, "'{}'"),
) -> String {
    // Within idempotency.max_payload_bytes before it is parsed: the parsed copy takes several times
    // the stored size.
    let document = args::document("document", document).unwrap_or_else(|| errors::null_argument("document"));
    // SAFETY: jsonb_out of a detoasted jsonb datum, valid for this call; it answers a C string.
    let text = unsafe {
        pgrx::fcinfo::direct_function_call::<&std::ffi::CStr>(|f| pgrx::pg_sys::jsonb_out(f), &[Some(document.datum())])
    };
    let text = text.expect("jsonb text").to_str().expect("jsonb text is UTF-8");
    let deepest = depth(text);
    if deepest > MAX_DEPTH {
        errors::too_deep("document", deepest, MAX_DEPTH);
    }
    let document: serde_json::Value = serde_json::from_str(text).expect("jsonb text is JSON");
    let Some(paths) = paths else { errors::null_argument("paths") };
    let paths: Vec<&str> = paths.iter().map(|p| p.unwrap_or_else(|| errors::null_argument("path"))).collect();
    fingerprint(document, &paths).unwrap_or_else(|e| errors::invalid(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_name_keeps_parts_apart() {
        assert_eq!(key_name(&["orders", "42"]), b"6:orders;2:42;".to_vec());
        assert_eq!(key_name(&["a;b"]), b"3:a;b;".to_vec());
        assert_ne!(key_name(&["a;b"]), key_name(&["a", "b"]));
        // Lengths count UTF-8 bytes, not characters.
        assert_eq!(key_name(&["é"]), "2:é;".as_bytes().to_vec());
    }

    #[test]
    fn key_is_the_rfc4122_v5_uuid_of_the_name() {
        // Python: uuid.uuid5(uuid.NAMESPACE_DNS, "6:orders;2:42;")
        let k = key(uuid::Uuid::NAMESPACE_DNS, &["orders", "42"]);
        assert_eq!(k.len(), 36);
        assert_eq!(&k[14..15], "5");
        assert_eq!(k, uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_DNS, b"6:orders;2:42;").to_string());
    }

    #[test]
    fn fingerprint_ignores_key_order_and_picks_pointers() {
        let a = serde_json::json!({"b": 1, "a": [1, 2, {"y": true, "x": null}]});
        let b = serde_json::json!({"a": [1, 2, {"x": null, "y": true}], "b": 1});
        assert_eq!(fingerprint(a.clone(), &[]), fingerprint(b, &[]));
        let picked = fingerprint_subject(a.clone(), &["/b", "/a/2/y", "/missing"]).unwrap();
        assert_eq!(picked, serde_json::json!({"/b": 1, "/a/2/y": true, "/missing": null}));
        assert!(fingerprint(a, &["b"]).is_err());
    }

    #[test]
    fn depth_counts_nesting_outside_strings() {
        assert_eq!(depth("1"), 0);
        assert_eq!(depth("[]"), 1);
        assert_eq!(depth(r#"{"a": [1, {"b": []}], "c": {}}"#), 4);
        assert_eq!(depth(r#"["[[[{", "\\\"[["]"#), 1);
        let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
        assert_eq!(depth(&deep), 5000);
    }

    #[test]
    fn the_deepest_document_taken_parses_and_canonicalizes() {
        let text = format!("{}1{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        // Paths add one level: still within what serde_json and the canonicalizer take.
        assert!(fingerprint(doc.clone(), &["/0"]).is_ok());
        assert_eq!(fingerprint(doc, &[]).unwrap().len(), 64);
    }

    #[test]
    fn fingerprint_canonical_text_is_jcs() {
        let v = serde_json::json!({"z": 1.0, "a": "é", "m": [1e21, 0.1]});
        let text = serde_json_canonicalizer::to_string(&v).unwrap();
        assert_eq!(text, r#"{"a":"é","m":[1e+21,0.1],"z":1}"#);
    }
}
