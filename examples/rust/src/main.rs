//! Rust: long jobs with lease heartbeats and fencing tokens (tokio-postgres + rskafka).
//!
//! Jobs arrive on a Kafka topic. A worker claims a job in TWO-TRANSACTION mode with a short lease
//! (`idem_claim(key, ttl)`, committed at once), keeps the lease alive with `idem_heartbeat(token)` while
//! the job runs, and records the result with `idem_complete(token)` in the same transaction as the
//! result row and the topic offset (`idem_record_offset`).
//!
//! One job is also handed to a second worker, as a rebalance would, while the first one stalls (a long
//! GC pause, a frozen VM) past its lease. The second worker waits for the lease to end, takes the job over
//! with a larger fencing token and finishes it. When the first worker wakes up, its completion is refused
//! with SQLSTATE 55006 and its result row is rolled back with it: the token fences the stale writer.
//!
//! Run: examples/rust/run
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::client::ClientBuilder;
use rskafka::record::Record;
use tokio::time::sleep;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

const LEASE_S: f64 = 2.0;
const BEAT: Duration = Duration::from_millis(600);
const STEP: Duration = Duration::from_millis(300);
const GROUP: &str = "renderer";

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
struct Job {
    key: String,
    steps: u32,
    offset: i64,
}

enum Done {
    Completed,
    Replayed(String),
    Fenced,
}

/// A worker: one connection for the work and the completion, one for the heartbeats, so that a beat
/// never queues behind the work's statements.
struct Worker {
    name: &'static str,
    db: Client,
    beats: Arc<Client>,
}

impl Worker {
    async fn new(name: &'static str) -> Result<Self, Error> {
        Ok(Worker { name, db: connect().await?, beats: Arc::new(connect().await?) })
    }
}

async fn connect() -> Result<Client, Error> {
    let conf = format!(
        "host={} port={} user=postgres dbname=ex_rust",
        std::env::var("IDEM_SOCKDIR")?,
        std::env::var("IDEM_PORT")?
    );
    let (client, connection) = tokio_postgres::connect(&conf, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// Runs one job under a lease. `stall` simulates a stop-the-world pause longer than the lease.
async fn run_job(w: &mut Worker, topic: &str, job: &Job, stall: bool) -> Result<Done, Error> {
    let worker = w.name;
    let db = &mut w.db;
    // 1. claim (its own transaction): wait while another holder's lease is live
    let mut seen_until = String::new();
    let token: i64 = loop {
        let row = db
            .query_one(
                "SELECT outcome, token, payload::text, expires_at::text FROM \
                 idem_claim($1, ttl => make_interval(secs => $2), scope => 'jobs')",
                &[&job.key, &LEASE_S],
            )
            .await?;
        match row.get::<_, &str>(0) {
            "claimed" => break row.get(1),
            "completed" => return Ok(Done::Replayed(row.get(2))),
            "in_progress" => {
                let until: &str = row.get::<_, Option<&str>>(3).unwrap_or("?");
                if until != seen_until {
                    println!("  {worker}: {} is leased by another worker until {until}, waiting", job.key);
                    seen_until = until.to_string();
                }
                sleep(Duration::from_millis(500)).await;
            }
            other => return Err(format!("{}: {other}", job.key).into()),
        }
    };
    println!("  {worker}: claimed {} with token {token}", job.key);

    // 2. heartbeats in the background while the job runs
    let paused = Arc::new(AtomicBool::new(false));
    let beats = {
        let (db, key, paused) = (w.beats.clone(), job.key.clone(), paused.clone());
        tokio::spawn(async move {
            loop {
                sleep(BEAT).await;
                if paused.load(Ordering::Relaxed) {
                    continue; // the whole process is "frozen": no heartbeat goes out
                }
                let beat = db
                    .query_one("SELECT idem_heartbeat($1, make_interval(secs => $2), 'jobs', $3)::text",
                               &[&key, &LEASE_S, &token])
                    .await;
                if let Err(e) = beat {
                    println!("  heartbeat for {key} failed: {}", e.as_db_error().map_or("?", |d| d.message()));
                    break;
                }
            }
        })
    };
    for step in 0..job.steps {
        sleep(STEP).await;
        if stall && step == 1 {
            println!("  {worker}: stalls for 3.5 s (no heartbeats) while holding {}", job.key);
            paused.store(true, Ordering::Relaxed);
            sleep(Duration::from_millis(3500)).await;
            paused.store(false, Ordering::Relaxed);
            break; // it wakes up believing its work is done
        }
    }
    beats.abort();

    // 3. complete with the token, in ONE transaction with the result row and the offset
    let outcome = async {
        let tx = db.transaction().await?;
        tx.execute("SELECT idem_complete($1, jsonb_build_object('worker', $2::text), 'jobs', $3)",
                   &[&job.key, &worker, &token]).await?;
        tx.execute("INSERT INTO job_results (job, worker, token) VALUES ($1, $2, $3)",
                   &[&job.key, &worker, &token]).await?;
        tx.query_one("SELECT idem_record_offset($1, $2, 0, $3)", &[&GROUP, &topic, &job.offset]).await?;
        tx.commit().await
    }
    .await;
    match outcome {
        Ok(()) => {
            println!("  {worker}: completed {} (token {token})", job.key);
            Ok(Done::Completed)
        }
        Err(e) if e.code() == Some(&SqlState::OBJECT_IN_USE) => {
            println!("  {worker}: completion of {} refused, 55006: {}", job.key,
                     e.as_db_error().map_or("?", |d| d.message()));
            Ok(Done::Fenced)
        }
        Err(e) => Err(e.into()),
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let setup = connect().await?;
    setup.batch_execute("CREATE TABLE job_results (job text, worker text, token bigint)").await?;

    // The topic and its jobs: "key:steps"; render-2 is produced twice (a producer retry).
    let topic = format!("render-jobs-{}", std::process::id());
    let kafka = ClientBuilder::new(vec![std::env::var("KAFKA_BOOTSTRAP")?]).build().await?;
    kafka.controller_client()?.create_topic(&topic, 1, 1, 5_000).await?;
    let partition = kafka.partition_client(topic.clone(), 0, UnknownTopicHandling::Retry).await?;
    for job in ["render-1:4", "render-2:3", "render-2:3", "render-3:8", "render-4:3"] {
        // one record per batch: tansu 0.6 cannot fetch from an offset inside a batch
        let record = Record {
            key: None,
            value: Some(job.as_bytes().to_vec()),
            headers: Default::default(),
            timestamp: chrono::Utc::now(),
        };
        partition.produce(vec![record], Compression::NoCompression).await?;
    }

    // Resume from the offset stored in the database (none yet: from the start).
    let next: Option<i64> = setup
        .query_one("SELECT idem_next_offset($1, $2, 0)", &[&GROUP, &topic])
        .await?
        .get(0);
    let (fetched, high) = partition.fetch_records(next.unwrap_or(0), 1..1_000_000, 1_000).await?;
    println!("fetched {} jobs (offsets up to {})", fetched.len(), high - 1);

    let (mut fenced, mut replayed) = (0, 0);
    let mut a = Worker::new("worker A").await?;
    for r in fetched {
        let value = String::from_utf8(r.record.value.unwrap_or_default())?;
        let (key, steps) = value.split_once(':').ok_or("bad job")?;
        let job = Job { key: key.to_string(), steps: steps.parse()?, offset: r.offset };
        let done = if job.key == "render-3" {
            // worker A takes this job and stalls; the job is handed to worker B too, as after a rebalance
            let stalled = {
                let (topic, job) = (topic.clone(), job.clone());
                let mut a = Worker::new("worker A").await?;
                tokio::spawn(async move { run_job(&mut a, &topic, &job, true).await })
            };
            sleep(Duration::from_millis(200)).await;
            run_job(&mut Worker::new("worker B").await?, &topic, &job, false).await?;
            stalled.await??
        } else {
            run_job(&mut a, &topic, &job, false).await?
        };
        match done {
            Done::Replayed(p) => {
                println!("  worker A: {} is a duplicate, stored result {p}", job.key);
                replayed += 1;
            }
            Done::Fenced => fenced += 1,
            Done::Completed => {}
        }
    }

    let row = setup
        .query_one("SELECT count(*), count(DISTINCT job), string_agg(job || '@' || worker, ', ' ORDER BY job) \
                    FROM job_results", &[])
        .await?;
    let (rows, jobs, list): (i64, i64, String) = (row.get(0), row.get(1), row.get(2));
    let next: i64 = setup.query_one("SELECT idem_next_offset($1, $2, 0)", &[&GROUP, &topic]).await?.get(0);
    let ok = rows == 4 && jobs == 4 && fenced == 1 && replayed == 1 && next == high;
    println!("rust: {rows} results for {jobs} jobs [{list}], {fenced} stale completion fenced, \
              {replayed} duplicate replayed, next offset {next}: {}", if ok { "OK" } else { "WRONG" });
    std::process::exit(if ok { 0 } else { 1 });
}
