//! `embed_migrations!("migrations")`: every `.sql` file of a folder (relative to the crate's
//! `Cargo.toml`), compiled into the binary with `include_bytes!`, as a
//! `dbwarden::EmbeddedMigrations`. Use it through the `dbwarden` crate, which re-exports it.
//!
//! No `syn`/`quote`: the input is one string literal, and the output is plain Rust text.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use proc_macro::TokenStream;

#[proc_macro]
pub fn embed_migrations(input: TokenStream) -> TokenStream {
    match expand(&input.to_string()) {
        Ok(code) => code,
        Err(msg) => format!("::core::compile_error!({msg:?})"),
    }
    .parse()
    .unwrap_or_else(|_| TokenStream::new())
}

fn expand(input: &str) -> Result<String, String> {
    let input = input.trim();
    let rel = if input.is_empty() {
        "migrations".to_owned()
    } else {
        literal(input)?
    };
    let root = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .ok_or("embed_migrations!: CARGO_MANIFEST_DIR is not set (build with cargo)")?;
    let dir = root.join(&rel);
    let files = sql_files(&dir)?;
    let mut out = String::from("::dbwarden::EmbeddedMigrations::new(");
    out.push_str(&format!("{rel:?}, &["));
    for (name, path) in files {
        let path = path
            .to_str()
            .ok_or_else(|| format!("embed_migrations!: {} is not UTF-8", path.display()))?;
        out.push_str(&format!(
            "::dbwarden::EmbeddedFile {{ name: {name:?}, bytes: ::core::include_bytes!({path:?}) }},"
        ));
    }
    out.push_str("])");
    Ok(out)
}

/// The text of a plain string literal (no escapes: a folder name has none).
fn literal(token: &str) -> Result<String, String> {
    let inner = token
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .ok_or_else(|| {
            format!("embed_migrations!: expected a folder as a string literal, e.g. embed_migrations!(\"migrations\"), got `{token}`")
        })?;
    if inner.contains('\\') || inner.contains('"') {
        return Err("embed_migrations!: write the folder without escapes".into());
    }
    Ok(inner.to_owned())
}

/// Every non-hidden `*.sql` file of `dir` (ups and downs; the library sorts them out), by name.
fn sql_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        format!(
            "embed_migrations!: cannot read the migrations folder {}: {e}",
            dir.display()
        )
    })?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("embed_migrations!: {}: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with('.') || !name.to_ascii_lowercase().ends_with(".sql") || !path.is_file()
        {
            continue;
        }
        out.push((name, path));
    }
    out.sort();
    Ok(out)
}
