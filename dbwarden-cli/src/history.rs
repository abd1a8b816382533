//! `dbwarden history`: the history table, read without the lock.

use dbwarden_core::{Error, ExitCode};

use crate::cli::HistoryArgs;
use crate::common::{layer, settings};
use crate::{engines, output};

pub async fn history(a: HistoryArgs) -> Result<ExitCode, Error> {
    let settings = settings(&a.common, layer(&a.common))?;
    let lock = engines::open(&settings)?;
    let rows = lock.read_history().await?;
    if a.json {
        println!("{}", serde_json::to_string(&rows).unwrap_or_default());
    } else {
        print!("{}", output::history_table(&rows));
    }
    Ok(ExitCode::OK)
}
