//! sqlx interoperation on the lock session: sqlx's own named lock and its `_sqlx_migrations` table.

use async_trait::async_trait;
use dbwarden_core::adopt::ForeignRow;
use dbwarden_core::{Error, SqlxCompat};
use dbwarden_sql::binds;

use crate::store::MySqlStore;
use crate::tables::db_err;

impl MySqlStore {
    /// sqlx's `GET_LOCK` name for this database: its lock key in lowercase hex.
    async fn sqlx_lock_name(&mut self) -> Result<String, Error> {
        let db: String = sqlx::query_scalar("SELECT DATABASE()")
            .fetch_one(&mut self.conn)
            .await
            .map_err(db_err)?;
        Ok(format!("{:x}", dbwarden_core::adopt::sqlx_lock_key(&db)))
    }
}

#[async_trait]
impl SqlxCompat for MySqlStore {
    async fn sqlx_table_exists(&mut self) -> Result<bool, Error> {
        self.guarded("looking for _sqlx_migrations", async |s| {
            binds::table_exists(&mut s.conn, "_sqlx_migrations", db_err).await
        })
        .await
    }

    async fn try_lock_sqlx(&mut self) -> Result<bool, Error> {
        if self.sqlx.locked {
            return Ok(true);
        }
        // A session holding sqlx's lock must end with the lease, never be kept.
        self.touched = true;
        let got = self
            .guarded("taking sqlx's lock", async |s| {
                let name = s.sqlx_lock_name().await?;
                let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                    .bind(name)
                    .fetch_one(&mut s.conn)
                    .await
                    .map_err(db_err)?;
                Ok(got == Some(1))
            })
            .await?;
        self.sqlx.locked = got;
        Ok(got)
    }

    async fn sqlx_rows(&mut self) -> Result<Vec<ForeignRow>, Error> {
        self.guarded("reading _sqlx_migrations", async |s| {
            binds::sqlx_rows(&mut s.conn, db_err).await
        })
        .await
    }

    async fn mirror_to_sqlx(&mut self) -> Result<(), Error> {
        self.guarded("creating _sqlx_migrations", async |s| {
            let create = sqlx::raw_sql(binds::CREATE_SQLX_TABLE);
            create.execute(&mut s.conn).await.map_err(db_err)
        })
        .await?;
        self.sqlx.mirror = true;
        Ok(())
    }
}
