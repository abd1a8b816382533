//! What a concurrent index build (`CREATE INDEX CONCURRENTLY`, `REINDEX … CONCURRENTLY`) left
//! behind when it was killed or failed: an INVALID index, which `IF NOT EXISTS` would keep and
//! a plain re-run would trip over. Core decides what it means and what to drop; the engine only
//! looks and drops ([`crate::IndexBuilds`]). See docs/design.md §9.

use super::holding::Holding;
use crate::migration::{IndexBuild, Migration};
use crate::recovery::InFlight;
use crate::{AuditRecord, Error, IndexState, MigrationStore};

/// Before statement `index` of `m` is sent: every INVALID index this build leaves when it dies
/// (an earlier attempt's) is dropped, audited as `dropped_invalid_index`, so the statement
/// builds its index anew instead of keeping a broken one (`IF NOT EXISTS`) or failing on it.
/// This is what a DBA does by hand, and what makes `resolve --retry` safe here.
pub(crate) async fn clear_leftovers(
    store: &mut dyn MigrationStore,
    h: &Holding<'_>,
    m: &Migration,
    index: usize,
) -> Result<(), Error> {
    let Some(build) = IndexBuild::of(m.statement(index), m.dialect) else {
        return Ok(());
    };
    let Some(indexes) = store.index_builds() else {
        return Ok(());
    };
    let leftovers: Vec<_> = indexes
        .invalid_indexes(build.relation())
        .await?
        .into_iter()
        .filter(|i| build.leaves(&i.name))
        .collect();
    for leftover in leftovers {
        h.lost.check()?;
        if let Some(indexes) = store.index_builds() {
            indexes.drop_index(h.token, &leftover).await?;
        }
        let reason = format!(
            "migration {}: statement {} builds an index concurrently and an earlier attempt left {leftover} INVALID; dropped it so the statement builds it anew",
            m.version,
            index + 1
        );
        tracing::warn!("{reason}");
        let record = AuditRecord::new(h.namespace(), "dropped_invalid_index", h.holder, reason);
        h.lost.check()?;
        store.audit(&record).await?;
    }
    Ok(())
}

/// What the server shows of statement `done` of `m`, in flight when its runner stopped: a
/// concurrent `CREATE INDEX` whose index is valid finished; one whose index is missing or
/// INVALID did not (and runs again, after [`clear_leftovers`]); a concurrent `REINDEX` can
/// always run again. Anything else, or an engine that cannot look: [`InFlight::Unknown`].
pub(crate) async fn in_flight(
    store: &mut dyn MigrationStore,
    m: &Migration,
    done: usize,
) -> Result<InFlight, Error> {
    if done >= m.statements.len() {
        return Ok(InFlight::Unknown);
    }
    let Some(build) = IndexBuild::of(m.statement(done), m.dialect) else {
        return Ok(InFlight::Unknown);
    };
    let Some(indexes) = store.index_builds() else {
        return Ok(InFlight::Unknown);
    };
    Ok(match &build {
        IndexBuild::Create { index, table } => match indexes.index_state(table, index).await? {
            IndexState::Valid => InFlight::Finished,
            IndexState::Invalid | IndexState::Missing => InFlight::NotFinished,
            // Still being built by the statement that was in flight: nobody can say yet.
            IndexState::Building => InFlight::Unknown,
        },
        IndexBuild::Reindex { .. } => InFlight::NotFinished,
    })
}
