//! The shared memory of the statistics: a header, the maintenance state of each database
//! ([`super::rounds`]) and a fixed table of counter slots, one per (database, scope).
//!
//! Sized at server start from `idempotency.stats_max_scopes` (requested in `shmem_request_hook`,
//! set up in `shmem_startup_hook`, as pg_stat_statements does). The slot table is an open-addressing
//! hash table without locks: a slot is taken once, by a compare-and-swap of its key, and never
//! moves or goes away (a reset zeroes its counters), so a backend remembers its slots for life and
//! publishes with atomic additions. It has twice as many slots as scopes may be counted, so probes
//! stay short; scopes beyond `stats_max_scopes` share one slot per database (scope NULL).
//!
//! The counters survive a clean shutdown: the postmaster writes them to `pg_stat/idempotency.stat`
//! when it exits, and reads (then removes) that file when it starts. After a crash they start at 0.
//! Rows whose counters are all 0 and rows of dropped databases are not written: a restart frees
//! their slots, which is the only way a slot is ever freed.
use super::rounds::{floor_char_boundary, Round};
use super::{now, COUNTERS};
use pgrx::pg_sys;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

/// The longest scope name kept. A longer scope is counted under its full name (the slot's key is
/// its hash) and shown cut, with a hash of the full name (see [`shown_name`]).
const NAME_BYTES: usize = 128;
/// Databases whose maintenance rounds are remembered.
pub const MAX_DATABASES: usize = 64;
const REGION_NAME: &std::ffi::CStr = c"idempotency statistics";
const DUMP_FILE: &str = "pg_stat/idempotency.stat";
/// Version 2 stores each slot's key; version 1 (0.4.0) did not, and is still read.
const DUMP_MAGIC: &[u8; 8] = b"IDEMST02";
const DUMP_MAGIC_V1: &[u8; 8] = b"IDEMST01";

#[repr(C)]
struct Header {
    /// Slots in the table that follows the header.
    slots: u32,
    /// Scopes that may get a slot of their own, and how many have one.
    max_scopes: u32,
    scopes: AtomicU32,
    rounds: [Round; MAX_DATABASES],
}

/// 296 bytes: the GUC's description and docs/reference.md give the memory a scope takes, two slots (see
/// [`slot_count`]); the assertion below keeps them in step with a change of the layout.
#[repr(C)]
struct Slot {
    /// 0 while free; else the hash of (database, scope, shared).
    key: AtomicU64,
    /// Set once the fields below `key` are written.
    ready: AtomicU32,
    db: AtomicU32,
    /// 1 for the slot shared by the scopes beyond `max_scopes`.
    shared: AtomicU32,
    name_len: AtomicU32,
    name: [AtomicU64; NAME_BYTES / 8],
    reset_at: AtomicI64,
    counts: [AtomicU64; COUNTERS],
}

const _: () = assert!(std::mem::size_of::<Slot>() == 296, "update the figures in gucs.rs and docs/reference.md");

static mut REGION: *mut Header = std::ptr::null_mut();
static mut PREV_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

/// Whether this process has the shared memory (the library was preloaded).
pub fn attached() -> bool {
    // SAFETY: a pointer set once in the postmaster before any backend forks; read-only after.
    !unsafe { REGION }.is_null()
}

fn header() -> &'static Header {
    // SAFETY: only called when attached(); the region lives as long as the server.
    unsafe { &*REGION }
}

fn slot(i: usize) -> &'static Slot {
    let h = header();
    assert!(i < h.slots as usize, "slot index in range");
    // SAFETY: the slots follow the header in the region, `slots` of them; i is in range.
    unsafe { &*((REGION as *mut u8).add(std::mem::size_of::<Header>()) as *const Slot).add(i) }
}

/// The maintenance state of database `db`, or None when all places are taken by other databases.
pub fn round_of(db: u32, create: bool) -> Option<&'static Round> {
    if !attached() {
        return None;
    }
    header().rounds.iter().find(|r| r.belongs_to(db, create))
}

fn region_size(max_scopes: usize) -> usize {
    std::mem::size_of::<Header>() + slot_count(max_scopes) * std::mem::size_of::<Slot>()
}

fn slot_count(max_scopes: usize) -> usize {
    2 * max_scopes + MAX_DATABASES
}

/// `_PG_init` while preloading: asks for the shared memory and hooks its set-up.
pub fn init() {
    super::register_callback();
    // SAFETY: reads a flag PostgreSQL sets while it loads shared_preload_libraries.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    // SAFETY: chains our hooks in front of the previous ones, once, in the postmaster.
    unsafe {
        PREV_REQUEST_HOOK = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request_memory);
        PREV_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(set_up_memory);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request_memory() {
    if let Some(prev) = PREV_REQUEST_HOOK {
        prev();
    }
    pg_sys::RequestAddinShmemSpace(region_size(crate::gucs::stats_max_scopes()));
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn set_up_memory() {
    if let Some(prev) = PREV_STARTUP_HOOK {
        prev();
    }
    let max_scopes = crate::gucs::stats_max_scopes();
    let size = region_size(max_scopes);
    let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock; // AddinShmemInitLock
    pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
    let mut found = false;
    let region = pg_sys::ShmemInitStruct(REGION_NAME.as_ptr(), size, &mut found) as *mut Header;
    if !found {
        // All zeroes is a valid empty state for every field (atomics, arrays, free slots).
        std::ptr::write_bytes(region as *mut u8, 0, size);
        (*region).slots = slot_count(max_scopes) as u32;
        (*region).max_scopes = max_scopes as u32;
    }
    REGION = region;
    pg_sys::LWLockRelease(init_lock);
    if !pg_sys::IsUnderPostmaster {
        if !found {
            load();
        }
        pg_sys::on_shmem_exit(Some(save_at_exit), pg_sys::Datum::from(0));
    }
}

// PostgreSQL's `common/hashfn.h`, which pgrx's bindings leave out. It never raises an ERROR.
extern "C" {
    fn hash_bytes_extended(k: *const u8, keylen: i32, seed: u64) -> u64;
}

/// PostgreSQL's hash of `bytes`: `hashtextextended(text, seed)` for a text. Stable across builds and
/// releases, so the keys saved in the shutdown file still match after an upgrade.
fn pg_hash(bytes: &[u8], seed: u64) -> u64 {
    // SAFETY: the pointer and length describe `bytes`, which lives across the call; the function
    // only reads them.
    unsafe { hash_bytes_extended(bytes.as_ptr(), bytes.len() as i32, seed) }
}

/// A slot's key: the hash of its database and full scope name (never 0, which marks a free slot).
fn hash_of(db: u32, scope: &str, shared: bool) -> u64 {
    let mut bytes = Vec::with_capacity(5 + scope.len());
    bytes.extend_from_slice(&db.to_le_bytes());
    bytes.push(shared as u8);
    bytes.extend_from_slice(scope.as_bytes());
    pg_hash(&bytes, 0).max(1)
}

/// The name a scope's row shows: the scope itself when it fits in NAME_BYTES; else its first bytes,
/// `~` and 16 hex digits of `hashtextextended(scope, 0)`, so that long scopes with the same beginning
/// show apart (and their Prometheus label sets differ).
fn shown_name(scope: &str) -> std::borrow::Cow<'_, str> {
    if scope.len() <= NAME_BYTES {
        return scope.into();
    }
    cut_name(scope, pg_hash(scope.as_bytes(), 0)).into()
}

fn cut_name(scope: &str, hash: u64) -> String {
    let suffix = format!("~{hash:016x}");
    let cut = floor_char_boundary(scope, NAME_BYTES - suffix.len());
    format!("{}{suffix}", &scope[..cut])
}

fn write_name(s: &Slot, name: &[u8]) {
    let name = &name[..name.len().min(NAME_BYTES)];
    for (i, word) in s.name.iter().enumerate() {
        let mut bytes = [0u8; 8];
        for (j, b) in bytes.iter_mut().enumerate() {
            *b = name.get(i * 8 + j).copied().unwrap_or(0);
        }
        word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
    }
    s.name_len.store(name.len() as u32, Ordering::Relaxed);
}

fn read_name(s: &Slot) -> String {
    let mut bytes: Vec<u8> = s.name.iter().flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes()).collect();
    bytes.truncate(s.name_len.load(Ordering::Relaxed) as usize);
    // A cut scope may end inside a character.
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Finds the slot of `key`, taking a free one for it when `take` allows. None when the table has no
/// free slot left (or `take` refused one).
fn find_or_take(key: u64, db: u32, scope: &str, shared: bool, take: &dyn Fn() -> bool) -> Option<usize> {
    let h = header();
    let n = h.slots as usize;
    let start = (key % n as u64) as usize;
    for probe in 0..n {
        let i = (start + probe) % n;
        let s = slot(i);
        let mut current = s.key.load(Ordering::Acquire);
        if current == 0 {
            if !take() {
                return None;
            }
            match s.key.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    s.db.store(db, Ordering::Relaxed);
                    s.shared.store(shared as u32, Ordering::Relaxed);
                    write_name(s, shown_name(scope).as_bytes());
                    s.reset_at.store(now(), Ordering::Relaxed);
                    s.ready.store(1, Ordering::Release);
                    return Some(i);
                }
                Err(winner) => {
                    if !shared {
                        h.scopes.fetch_sub(1, Ordering::Relaxed);
                    }
                    current = winner;
                }
            }
        }
        if current == key {
            // Taken by another backend for the same key an instant ago: its fields come next.
            while s.ready.load(Ordering::Acquire) == 0 {
                std::hint::spin_loop();
            }
            if s.db.load(Ordering::Relaxed) == db && (s.shared.load(Ordering::Relaxed) == 1) == shared {
                return Some(i);
            }
        }
    }
    None
}

/// The slot that counts `scope` of database `db`: its own, or the shared one of the database once
/// `max_scopes` scopes have one. The shared slots always find room (the table has `MAX_DATABASES`
/// slots beyond twice `max_scopes`); past that, the last slot (never reached in practice).
pub fn slot_of(db: u32, scope: &str) -> usize {
    own_slot(hash_of(db, scope, false), db, scope)
        .or_else(|| shared_slot(db))
        .unwrap_or(header().slots as usize - 1)
}

/// The slot of the scope whose key is `key`, taken (named `scope`) while fewer than `max_scopes` are.
fn own_slot(key: u64, db: u32, scope: &str) -> Option<usize> {
    let h = header();
    find_or_take(key, db, scope, false, &|| {
        if h.scopes.fetch_add(1, Ordering::Relaxed) < h.max_scopes {
            return true;
        }
        h.scopes.fetch_sub(1, Ordering::Relaxed);
        false
    })
}

/// The slot shared by the scopes of `db` beyond `max_scopes`.
fn shared_slot(db: u32) -> Option<usize> {
    find_or_take(hash_of(db, "", true), db, "", true, &|| true)
}

/// Adds a backend's counts to a slot.
pub fn add_all(i: usize, counts: &[u64; COUNTERS]) {
    let s = slot(i);
    for (total, &n) in s.counts.iter().zip(counts) {
        if n != 0 {
            total.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// One row of `idempotency.stats`.
pub struct ScopeRow {
    /// None for the slot shared by the scopes beyond `idempotency.stats_max_scopes`.
    pub scope: Option<String>,
    pub counts: [u64; COUNTERS],
    pub reset_at: i64,
}

/// The rows of database `db`, when attached.
pub fn rows(db: u32) -> Option<Vec<ScopeRow>> {
    if !attached() {
        return None;
    }
    let mut rows = Vec::new();
    for i in 0..header().slots as usize {
        let s = slot(i);
        if s.ready.load(Ordering::Acquire) == 0 || s.db.load(Ordering::Relaxed) != db {
            continue;
        }
        let shared = s.shared.load(Ordering::Relaxed) == 1;
        rows.push(ScopeRow {
            scope: (!shared).then(|| read_name(s)),
            counts: std::array::from_fn(|c| s.counts[c].load(Ordering::Relaxed)),
            reset_at: s.reset_at.load(Ordering::Relaxed),
        });
    }
    Some(rows)
}

/// Zeroes the counters of database `db` (one scope, or all of them with `scope` None, the shared row
/// included). Returns the time of the reset.
pub fn reset(db: u32, scope: Option<&str>) -> i64 {
    let at = now();
    if !attached() {
        return at;
    }
    // A scope's slot is found by its key, the hash of its full name (the slot keeps a cut name only);
    // the name a row shows is accepted too.
    let wanted = scope.map(|name| (hash_of(db, name, false), name));
    for i in 0..header().slots as usize {
        let s = slot(i);
        if s.ready.load(Ordering::Acquire) == 0 || s.db.load(Ordering::Relaxed) != db {
            continue;
        }
        let shared = s.shared.load(Ordering::Relaxed) == 1;
        if wanted.is_some_and(|(key, name)| {
            shared || (s.key.load(Ordering::Relaxed) != key && read_name(s) != name)
        }) {
            continue;
        }
        for c in &s.counts {
            c.store(0, Ordering::Relaxed);
        }
        s.reset_at.store(at, Ordering::Relaxed);
    }
    at
}

/// Postmaster exit: keeps the counters for the next start, after a clean shutdown only.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn save_at_exit(code: std::ffi::c_int, _arg: pg_sys::Datum) {
    if code != 0 || !attached() {
        return;
    }
    if let Err(e) = save() {
        pgrx::log!("idempotency: could not write {DUMP_FILE}: {e}");
    }
}

/// A slot as written to the file of the last clean shutdown.
#[derive(Debug, PartialEq, Eq)]
struct Saved {
    db: u32,
    shared: bool,
    /// The slot's key; None in a file of version 1, whose rows are hashed again by name.
    key: Option<u64>,
    name: String,
    reset_at: i64,
    counts: [u64; COUNTERS],
}

fn save() -> std::io::Result<()> {
    let mut known = std::collections::HashMap::new();
    let mut exists = |db| *known.entry(db).or_insert_with(|| database_exists(std::path::Path::new("."), db));
    let saved: Vec<Saved> = (0..header().slots as usize)
        .map(slot)
        .filter(|s| s.ready.load(Ordering::Acquire) != 0)
        .map(|s| Saved {
            db: s.db.load(Ordering::Relaxed),
            shared: s.shared.load(Ordering::Relaxed) == 1,
            key: Some(s.key.load(Ordering::Relaxed)),
            name: read_name(s),
            reset_at: s.reset_at.load(Ordering::Relaxed),
            counts: std::array::from_fn(|c| s.counts[c].load(Ordering::Relaxed)),
        })
        // Slots are never freed while the server runs: leaving out the empty rows (reset, or never
        // counted) and those of dropped databases frees their slots at the next start.
        .filter(|r| r.counts.iter().any(|&n| n != 0) && exists(r.db))
        .collect();
    let tmp = format!("{DUMP_FILE}.tmp");
    std::fs::write(&tmp, encode(&saved))?;
    std::fs::rename(tmp, DUMP_FILE)
}

/// Whether database `db` still has its directory under `data_dir` (the postmaster, which has no
/// catalog access, runs in the data directory): `base/<oid>`, or `<oid>` in a tablespace's version
/// directory for a database made in another tablespace. True when in doubt.
fn database_exists(data_dir: &std::path::Path, db: u32) -> bool {
    let name = db.to_string();
    let base = data_dir.join("base");
    if !base.is_dir() || base.join(&name).exists() {
        return true;
    }
    let Ok(spaces) = std::fs::read_dir(data_dir.join("pg_tblspc")) else {
        return true;
    };
    // pg_tblspc/<tablespace>/PG_<version>_<catalog version>/<database>
    spaces.flatten().any(|space| {
        std::fs::read_dir(space.path())
            .into_iter()
            .flatten()
            .flatten()
            .any(|version| version.path().join(&name).exists())
    })
}

/// Server start: takes back the counters of the last clean shutdown, then removes the file (so a
/// crash later does not bring back stale counts).
fn load() {
    let Ok(bytes) = std::fs::read(DUMP_FILE) else {
        return;
    };
    let _ = std::fs::remove_file(DUMP_FILE);
    let Some(saved) = decode(&bytes) else {
        pgrx::log!("idempotency: ignored {DUMP_FILE}: not a statistics file of this version");
        return;
    };
    for row in saved {
        // By the saved key: a long scope's name is cut, so hashing the name would give another key.
        let key = row.key.unwrap_or_else(|| hash_of(row.db, &row.name, false));
        let own = if row.shared { None } else { own_slot(key, row.db, &row.name) };
        if let Some(i) = own.or_else(|| shared_slot(row.db)) {
            add_all(i, &row.counts);
            slot(i).reset_at.store(row.reset_at, Ordering::Relaxed);
        }
    }
}

/// The file: a magic, how many counters each row has, then the rows, little-endian.
fn encode(rows: &[Saved]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(DUMP_MAGIC);
    out.extend_from_slice(&(COUNTERS as u32).to_le_bytes());
    for r in rows {
        out.extend_from_slice(&r.db.to_le_bytes());
        out.push(r.shared as u8);
        out.extend_from_slice(&r.key.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&(r.name.len() as u32).to_le_bytes());
        out.extend_from_slice(r.name.as_bytes());
        out.extend_from_slice(&r.reset_at.to_le_bytes());
        for c in &r.counts {
            out.extend_from_slice(&c.to_le_bytes());
        }
    }
    out
}

/// The rows of a file, None when it is not one (or is cut short). A file of a version with fewer
/// counters leaves the new ones at 0; one with more drops those this version does not know. A file
/// of version 1 has no keys.
fn decode(bytes: &[u8]) -> Option<Vec<Saved>> {
    let mut r = Reader(bytes);
    let with_keys = match r.take(8)? {
        magic if magic == DUMP_MAGIC => true,
        magic if magic == DUMP_MAGIC_V1 => false,
        _ => return None,
    };
    let stored = r.u32()? as usize;
    let mut rows = Vec::new();
    while !r.0.is_empty() {
        let db = r.u32()?;
        let shared = r.take(1)?[0] == 1;
        let key = match with_keys {
            true => Some(r.u64()?).filter(|&k| k != 0),
            false => None,
        };
        let len = r.u32()? as usize;
        let name = std::str::from_utf8(r.take(len)?).ok()?.to_owned();
        let reset_at = r.u64()? as i64;
        let mut counts = [0u64; COUNTERS];
        for i in 0..stored {
            let n = r.u64()?;
            if let Some(c) = counts.get_mut(i) {
                *c = n;
            }
        }
        rows.push(Saved { db, shared, key, name, reset_at, counts });
    }
    Some(rows)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod file_tests {
    use super::*;

    fn row(db: u32, name: &str, shared: bool, n: u64) -> Saved {
        Saved {
            db,
            shared,
            key: Some(0xabcd_0000 + n),
            name: name.into(),
            reset_at: 7_000_000 + n as i64,
            counts: std::array::from_fn(|i| n * 100 + i as u64),
        }
    }

    #[test]
    fn a_file_reads_back_as_written() {
        let rows =
            vec![row(16384, "payments", false, 1), row(16384, "", true, 2), row(5, "é-ü 😀", false, 3)];
        assert_eq!(decode(&encode(&rows)), Some(rows));
        assert_eq!(decode(&encode(&[])), Some(vec![]));
    }

    #[test]
    fn a_file_keeps_the_key_of_a_cut_name() {
        // The key is the hash of the full name, which the cut name cannot give back.
        let cut = Saved { key: Some(u64::MAX - 1), ..row(1, &"s".repeat(NAME_BYTES), false, 4) };
        let rows = decode(&encode(std::slice::from_ref(&cut))).expect("readable");
        assert_eq!(rows[0].key, Some(u64::MAX - 1));
        assert_eq!(rows, vec![cut]);
    }

    #[test]
    fn a_damaged_or_foreign_file_is_refused() {
        let bytes = encode(&[row(1, "a", false, 1), row(1, "b", false, 2)]);
        for cut in [0, 4, 8, 11, 20, bytes.len() - 1] {
            assert_eq!(decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut foreign = bytes.clone();
        foreign[0] = b'X';
        assert_eq!(decode(&foreign), None);
        let mut future = bytes.clone();
        future[7] = b'3';
        assert_eq!(decode(&future), None, "a later version's file");
    }

    #[test]
    fn a_version_1_file_is_read_without_keys_and_other_counters() {
        // Written by 0.4.0 (no keys), by a version with 3 counters only.
        let mut bytes = DUMP_MAGIC_V1.to_vec();
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&9u32.to_le_bytes());
        bytes.push(0);
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.push(b's');
        bytes.extend_from_slice(&42i64.to_le_bytes());
        for n in [10u64, 20, 30] {
            bytes.extend_from_slice(&n.to_le_bytes());
        }
        let rows = decode(&bytes).expect("readable");
        assert_eq!(rows[0].counts[..3], [10, 20, 30]);
        assert!(rows[0].counts[3..].iter().all(|&n| n == 0));
        assert_eq!((rows[0].db, rows[0].key, rows[0].name.as_str(), rows[0].reset_at), (9, None, "s", 42));
    }

    #[test]
    fn a_long_name_is_cut_with_a_hash_of_the_whole() {
        let long = "x".repeat(200);
        let a = cut_name(&long, 0x0123_4567_89ab_cdef);
        assert_eq!(a, format!("{}~0123456789abcdef", "x".repeat(NAME_BYTES - 17)));
        assert_ne!(a, cut_name(&long, 1), "two scopes with the same beginning show apart");
        assert_eq!(cut_name(&long, 1).len(), NAME_BYTES);
        // Cut at a character's boundary: 2-byte characters, 111 bytes left for them.
        let wide = cut_name(&"é".repeat(100), 7);
        assert_eq!(wide, format!("{}~0000000000000007", "é".repeat(55)));
    }

    #[test]
    fn a_dropped_database_is_one_without_its_directory() {
        let dir = std::env::temp_dir().join(format!("idem-stats-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(database_exists(&dir, 5), "not a data directory: keep everything");
        std::fs::create_dir_all(dir.join("base/5")).unwrap();
        std::fs::create_dir_all(dir.join("pg_tblspc/16400/PG_15_202209061/7")).unwrap();
        let found: Vec<bool> = [5, 6, 7].iter().map(|&db| database_exists(&dir, db)).collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found, [true, false, true]);
    }
}
