//! `idem_status`: a key's record as SQL reads it, for people and tools (not for deciding).
use super::call::Call;
use super::pg::document::Document;
use super::pg::spi::{Snap, Stmt};
use super::record::Key;
use pgrx::pg_sys;

static STATUS: Stmt = Stmt {
    sql: "SELECT status, attempts, token, payload, error, created_at, updated_at, expires_at
            FROM idempotency.records WHERE scope = $1 AND key = $2",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
};

pub struct StatusRow {
    pub status: String,
    pub attempts: i32,
    pub token: Option<i64>,
    pub payload: Option<Document>,
    pub error: Option<Document>,
    pub created_at: pg_sys::TimestampTz,
    pub updated_at: pg_sys::TimestampTz,
    pub expires_at: Option<pg_sys::TimestampTz>,
}

pub fn status(k: Key) -> Option<StatusRow> {
    Call::run(k.scope, |call| {
        let rows = call.conn_reading(k).run(&STATUS, &k.args(), Snap::Statement);
        if rows.len() == 0 {
            return None;
        }
        Some(StatusRow {
            status: rows.get(0, 1).expect("status"),
            attempts: rows.get(0, 2).expect("attempts"),
            token: rows.get(0, 3),
            payload: rows.get_document(0, 4),
            error: rows.get_document(0, 5),
            created_at: rows.get_ts(0, 6).expect("created_at"),
            updated_at: rows.get_ts(0, 7).expect("updated_at"),
            expires_at: rows.get_ts(0, 8),
        })
    })
}
