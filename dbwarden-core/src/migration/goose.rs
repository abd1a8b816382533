//! goose's annotated SQL files, so a folder goose ran works after `dbwarden adopt --from goose`:
//! one file holds both directions (`-- +goose Up`, `-- +goose Down`), `-- +goose
//! StatementBegin` … `-- +goose StatementEnd` marks one statement whatever its `;`s, and `--
//! +goose NO TRANSACTION` runs the file without a transaction. Only the Up part runs.

use std::ops::Range;

/// Where a goose file's parts are, as byte ranges of its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The Up part: what `migrate` runs.
    pub(crate) up: Range<usize>,
    /// `StatementBegin` … `StatementEnd` blocks inside the Up part (their inner text).
    pub(crate) blocks: Vec<Range<usize>>,
    /// `-- +goose NO TRANSACTION` is present.
    pub(crate) no_transaction: bool,
}

/// One annotation line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Note {
    Up,
    Down,
    Begin,
    End,
    NoTransaction,
    Other,
}

/// The goose annotation on this line, if it is one (`-- +goose <word>`, any case).
fn note(line: &str) -> Option<Note> {
    let body = line.trim().strip_prefix("--")?.trim_start();
    let rest = body
        .get(..6)
        .filter(|p| p.eq_ignore_ascii_case("+goose"))
        .and_then(|_| body.get(6..))?;
    let words: Vec<String> = rest
        .split_whitespace()
        .map(str::to_ascii_uppercase)
        .collect();
    Some(
        match words.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["UP", ..] => Note::Up,
            ["DOWN", ..] => Note::Down,
            ["STATEMENTBEGIN"] => Note::Begin,
            ["STATEMENTEND"] => Note::End,
            ["NO", "TRANSACTION"] => Note::NoTransaction,
            _ => Note::Other,
        },
    )
}

/// The file's layout when it is a goose file (it has a `-- +goose` line); `Err` with the line
/// number and what is wrong when its annotations cannot be followed.
pub(crate) fn layout(sql: &str) -> Result<Option<Layout>, (usize, String)> {
    let marker = |b: &[u8]| b.eq_ignore_ascii_case(b"+goose");
    if !sql.as_bytes().windows(6).any(marker) {
        return Ok(None);
    }
    let mut up: Option<usize> = None;
    let mut down: Option<usize> = None;
    let mut begin: Option<usize> = None;
    let mut blocks = Vec::new();
    let mut no_transaction = false;
    let mut seen = false;
    let mut offset = 0;
    for (index, line) in sql.split_inclusive('\n').enumerate() {
        let start = offset;
        offset += line.len();
        let Some(n) = note(line) else {
            continue;
        };
        seen = true;
        let in_up = up.is_some() && down.is_none();
        match n {
            Note::Up if up.is_none() => up = Some(offset),
            Note::Down if down.is_none() && begin.is_none() => down = Some(start),
            Note::Begin if in_up && begin.is_none() => begin = Some(offset),
            Note::End if in_up => match begin.take() {
                Some(b) => blocks.push(b..start),
                None => return Err((index + 1, "StatementEnd without StatementBegin".into())),
            },
            Note::Begin | Note::End => {}
            Note::NoTransaction => no_transaction = true,
            Note::Other => {
                return Err((
                    index + 1,
                    format!(
                        "`{}` is a goose annotation dbwarden does not follow (ENVSUB and the like)",
                        line.trim()
                    ),
                ));
            }
            Note::Up | Note::Down => {
                return Err((index + 1, "a second Up or Down annotation".into()));
            }
        }
    }
    if !seen {
        return Ok(None);
    }
    if begin.is_some() {
        return Err((0, "StatementBegin without StatementEnd".into()));
    }
    let Some(up) = up else {
        return Err((0, "goose annotations but no `-- +goose Up`".into()));
    };
    Ok(Some(Layout {
        up: up..down.unwrap_or(sql.len()).max(up),
        blocks,
        no_transaction,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_down_blocks_and_no_transaction() {
        let sql = "-- +goose Up\n-- +goose StatementBegin\nCREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql;\n-- +goose StatementEnd\nCREATE TABLE t (id int);\n\n-- +goose Down\nDROP TABLE t;\n";
        let l = layout(sql).unwrap().unwrap();
        assert!(sql[l.up.clone()].contains("CREATE TABLE t"));
        assert!(!sql[l.up.clone()].contains("DROP TABLE"));
        assert_eq!(l.blocks.len(), 1);
        assert_eq!(
            sql[l.blocks[0].clone()].trim(),
            "CREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql;"
        );
        assert!(!l.no_transaction);
        let nt = "-- +goose NO TRANSACTION\n-- +goose up\nCREATE INDEX CONCURRENTLY i ON t (c);\n";
        assert!(layout(nt).unwrap().unwrap().no_transaction);
    }

    #[test]
    fn plain_files_are_not_goose_files() {
        assert_eq!(
            layout("CREATE TABLE t (id int); -- +goose Up").unwrap(),
            None
        );
        assert_eq!(layout("-- goose Up\nSELECT 1;").unwrap(), None);
    }

    #[test]
    fn annotations_that_cannot_be_followed_are_errors() {
        assert!(layout("-- +goose Down\nDROP TABLE t;").is_err());
        assert!(layout("-- +goose Up\n-- +goose StatementBegin\nSELECT 1;").is_err());
        assert!(layout("-- +goose Up\n-- +goose StatementEnd\n").is_err());
        assert!(layout("-- +goose Up\n-- +goose ENVSUB ON\nSELECT '${X}';").is_err());
    }
}
