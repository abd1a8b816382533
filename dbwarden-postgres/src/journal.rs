//! PostgreSQL's side of core's journal: [`JournalSession`] for [`PgStore`], the lock session.

use async_trait::async_trait;
use dbwarden_core::journal::in_transaction;
use dbwarden_core::migration::{Migration, Statement};
use dbwarden_core::{
    Entry, Error, Fence, FencingToken, HistoryRow, JournalSession, SqlxCompat, Tx, Within, Write,
};
use sqlx::AssertSqlSafe;

use crate::literal::literal;
use crate::store::PgStore;
use crate::tables::{insert_audit, local_bounds, read_history};

/// The journal itself is core's ([`dbwarden_core::journal`]); this is PostgreSQL's side of it:
/// the file goes to the server as written, in one simple query; fenced writes carry the fence
/// in the same statement where they can (one round trip).
#[async_trait]
impl JournalSession for PgStore {
    async fn begin(&mut self, kind: Tx) -> Result<(), Error> {
        let begin = match kind {
            Tx::Short => format!("BEGIN; {}", local_bounds(self.ms)),
            Tx::Migration => format!("BEGIN; {}", self.tx_bounds),
        };
        sqlx::raw_sql(AssertSqlSafe(begin))
            .execute(&mut self.conn)
            .await
            .map_err(|e| self.err(e))?;
        self.tx = Some(kind);
        Ok(())
    }

    async fn end(&mut self, outcome: Result<(), Error>) -> Result<(), Error> {
        if let Err(cause) = outcome {
            return Err(self.roll_back(cause).await);
        }
        self.tx = None;
        sqlx::raw_sql("COMMIT")
            .execute(&mut self.conn)
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    async fn check_fence(&mut self, token: FencingToken, hold: bool) -> Result<(), Error> {
        PgStore::check_fence(self, token, hold).await
    }

    async fn execute(
        &mut self,
        m: &Migration,
        range: std::ops::Range<usize>,
        _within: Within,
    ) -> Result<(), Error> {
        self.touched = true;
        if range == (0..m.statements.len()) {
            return self.run_text(m, 0, m.body_start(), m.body()).await;
        }
        let Some((start, text)) = m.text_of(range.clone()) else {
            return Ok(());
        };
        self.run_text(m, range.start, start, text).await
    }

    async fn write(&mut self, row: Write<'_>, fence: Fence) -> Result<(), Error> {
        if let Write::Audit(record) = row {
            let r = insert_audit(&mut self.conn, &self.tables, record).await;
            return r.map_err(|e| self.ended(e));
        }
        if self.tx == Some(Tx::Migration) {
            // The migration's statements are done: what follows is bookkeeping, bounded (in
            // the history row's own round trip when that comes first).
            self.tx = Some(Tx::Short);
            if let Write::History(e) = row {
                return self.upsert_history_bounded(&e).await;
            }
            self.bound_rest().await?;
        }
        match row {
            Write::Working(m) => self.name_migration(m, fence).await,
            // Fenced in the same statement, whatever `fence` says: no dearer.
            Write::History(e) => self.upsert_history(&e).await,
            Write::Done { m, done } => match fence {
                Fence::Hold(token) => self.record_in_place(token, m, done, true).await,
                Fence::Check(token) => self.record_in_place(token, m, done, false).await,
                Fence::Held => {
                    let q = self.query(format!(
                        "UPDATE {} SET statements_done = $1 WHERE version = $2",
                        self.tables.history
                    ));
                    self.exec(q.bind(done as i64).bind(m.version)).await?;
                    Ok(())
                }
            },
            Write::Mirror { m, nanos, ran } => self.mirror_row(m, nanos, ran).await,
            row => {
                if let Some(token) = fence.token() {
                    PgStore::check_fence(self, token, matches!(fence, Fence::Hold(_))).await?;
                }
                let q = match row {
                    Write::State(state, m) => self.state_query(state, m),
                    Write::End {
                        m,
                        state,
                        duration_ms,
                        done,
                    } => {
                        let sql = format!(
                            "UPDATE {} SET state = $1, finished_at = clock_timestamp(), duration_ms = $2, statements_done = COALESCE($3, statements_done) WHERE version = $4",
                            self.tables.history
                        );
                        let q = self.query(sql).bind(state.as_str()).bind(duration_ms);
                        q.bind(done.map(|d| d as i64)).bind(m.version)
                    }
                    Write::Forget(version) => {
                        let sql = format!("DELETE FROM {} WHERE version = $1", self.tables.history);
                        self.query(sql).bind(version)
                    }
                    Write::Working(_)
                    | Write::History(_)
                    | Write::Done { .. }
                    | Write::Mirror { .. }
                    | Write::Audit(_) => {
                        unreachable!("written above")
                    }
                };
                self.exec(q).await?;
                Ok(())
            }
        }
    }

    /// Naming the migration before a whole-file transaction: one simple query, not worth a
    /// WAL flush (see [`PgStore::set_version`]); anything else in a short transaction.
    async fn write_alone(&mut self, row: Write<'_>, fence: Fence) -> Result<(), Error> {
        if let (Write::Working(m), Some(token)) = (row, fence.token()) {
            return self.set_version(token, m).await;
        }
        in_transaction(self, Tx::Short, async |s| s.write(row, fence).await).await
    }

    fn mirrors_to_sqlx(&self) -> bool {
        self.sqlx.mirror
    }

    async fn history(&mut self) -> Result<Vec<HistoryRow>, Error> {
        let r = read_history(&mut self.conn, &self.tables).await;
        r.map_err(|e| self.ended(e))
    }

    /// In a file that cannot run in one transaction, data changes commit with their journal
    /// entry; anything else (a schema change, a concurrent index build) runs alone.
    fn journals_in_transaction(&self, s: &Statement) -> bool {
        s.batchable
    }

    fn index_builds(&mut self) -> Option<&mut dyn dbwarden_core::IndexBuilds> {
        Some(self)
    }

    async fn bound_statements(
        &mut self,
        lock_timeout: Option<std::time::Duration>,
        statement_timeout: Option<std::time::Duration>,
    ) -> Result<(), Error> {
        self.bound(lock_timeout, statement_timeout).await
    }

    fn session(&self) -> Option<String> {
        // Behind a pooler the backend changes from one transaction to the next.
        (!self.pooled).then(|| self.pid.to_string())
    }

    fn sqlx_compat(&mut self) -> Option<&mut dyn SqlxCompat> {
        // sqlx's migrator takes a session advisory lock, which a transaction pooler voids:
        // there is no sqlx to interoperate with behind one.
        if self.pooled {
            return None;
        }
        Some(self)
    }
}

/// The history row, as the journal writes it on PostgreSQL.
impl PgStore {
    /// The history upsert, fenced in the same statement: the row comes from the status row
    /// only while it still carries our token, locked `FOR UPDATE` until commit so no new holder
    /// can bump the token under this write. Zero rows inserted = fenced out. `v`: the ten
    /// values, as `$n` parameters or as literals.
    fn upsert_history_sql(&self, v: [&str; 10]) -> String {
        let [
            version,
            description,
            checksum,
            state,
            total,
            done,
            execution,
            duration,
            ns,
            token,
        ] = v;
        format!(
            "INSERT INTO {t} (version, description, checksum, state, statements_total, statements_done, execution_id, fencing_token, started_at, finished_at, duration_ms)
             SELECT {version}, {description}, {checksum}, {state}, {total}, {done}, {execution}, fencing_token, now(), CASE WHEN {state} IN ('APPLIED', 'REVERTED') THEN clock_timestamp() END, {duration}
             FROM {l} WHERE namespace = {ns} AND fencing_token = {token} FOR UPDATE
             ON CONFLICT (version) DO UPDATE SET description = EXCLUDED.description,
               checksum = EXCLUDED.checksum, state = EXCLUDED.state,
               statements_total = EXCLUDED.statements_total, statements_done = EXCLUDED.statements_done,
               execution_id = EXCLUDED.execution_id, fencing_token = EXCLUDED.fencing_token,
               started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
               duration_ms = EXCLUDED.duration_ms",
            t = self.tables.history,
            l = self.tables.lock
        )
    }

    /// Inside a bounded transaction: write `m`'s history row if the token is still ours
    /// (see [`Self::upsert_history_sql`]), else report the fence.
    pub(crate) async fn upsert_history(&mut self, e: &Entry<'_>) -> Result<(), Error> {
        let w = dbwarden_sql::HistoryWrite::of(e);
        let params = ["$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8", "$9", "$10"];
        let q = w.bind(self.query(self.upsert_history_sql(params)));
        let q = q.bind(e.duration_ms).bind(self.namespace.clone());
        let n = self.exec(q.bind(e.token.0 as i64)).await?;
        self.upserted(n, e).await
    }

    /// [`Self::upsert_history`] right after a migration's statements, with the bookkeeping
    /// bounds that follow them set in the same simple query: one round trip, not two, for
    /// every file that runs in one transaction.
    pub(crate) async fn upsert_history_bounded(&mut self, e: &Entry<'_>) -> Result<(), Error> {
        let int = |n: i64| n.to_string();
        let (version, total, done) = (
            int(e.m.version),
            int(e.m.statements.len() as i64),
            int(e.done as i64),
        );
        let duration = e.duration_ms.map_or("NULL::bigint".to_owned(), int);
        let token = int(e.token.0 as i64);
        let texts = [
            literal(&e.m.description)?,
            literal(&e.m.checksum)?,
            literal(e.state.as_str())?,
            literal(&e.execution_id.to_string())?,
            literal(&self.namespace)?,
        ];
        let [description, checksum, state, execution, ns] = texts.each_ref().map(String::as_str);
        let insert = self.upsert_history_sql([
            &version,
            description,
            checksum,
            state,
            &total,
            &done,
            execution,
            &duration,
            ns,
            &token,
        ]);
        let sql = format!("{}; {insert}", local_bounds(self.ms));
        let r = sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut self.conn)
            .await
            .map_err(|x| self.err(x))?;
        self.upserted(r.rows_affected(), e).await
    }

    /// A history upsert that wrote `n` rows: none means fenced out (or the status row gone).
    async fn upserted(&mut self, n: u64, e: &Entry<'_>) -> Result<(), Error> {
        if n == 0 {
            let what = format!("recording migration {}: the status row", e.m.version);
            return self.unmatched(e.token, &what).await;
        }
        Ok(())
    }
}
