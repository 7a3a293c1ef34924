//! PostgreSQL's hash of bytes, and a slot's key made with it. The keys are saved in the file of the
//! last clean shutdown ([`super::persist`]), so the hash must be one that never changes: PostgreSQL's
//! own, not Rust's.

// PostgreSQL's `common/hashfn.h`, which pgrx's bindings leave out. It never raises an ERROR.
extern "C" {
    fn hash_bytes_extended(k: *const u8, keylen: i32, seed: u64) -> u64;
}

/// PostgreSQL's hash of `bytes`: `hashtextextended(text, seed)` for a text. Stable across builds and
/// releases, so the keys saved in the shutdown file still match after an upgrade.
pub(super) fn pg_hash(bytes: &[u8], seed: u64) -> u64 {
    // SAFETY: the pointer and length describe `bytes`, which lives across the call; the function
    // only reads them.
    unsafe { hash_bytes_extended(bytes.as_ptr(), bytes.len() as i32, seed) }
}

/// A slot's key: the hash of its database and full scope name (never 0, which marks a free slot).
pub(super) fn hash_of(db: u32, scope: &str, shared: bool) -> u64 {
    let mut bytes = Vec::with_capacity(5 + scope.len());
    bytes.extend_from_slice(&db.to_le_bytes());
    bytes.push(shared as u8);
    bytes.extend_from_slice(scope.as_bytes());
    pg_hash(&bytes, 0).max(1)
}
