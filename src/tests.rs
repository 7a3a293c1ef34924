//! Unit tests, each in its own rolled-back transaction (`cargo pgrx test`).
#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn one<T: IntoDatum + FromDatum>(sql: &str) -> Option<T> {
        Spi::get_one::<T>(sql).expect("query runs")
    }

    #[pg_test]
    fn claim_then_complete_replays_payload() {
        assert_eq!(one::<String>("SELECT outcome FROM idem_claim('u1')").as_deref(), Some("claimed"));
        Spi::run(r#"SELECT idem_complete('u1', '{"amount": 12.10}')"#).unwrap();
        assert_eq!(one::<String>("SELECT outcome FROM idem_claim('u1')").as_deref(), Some("completed"));
        // Numbers survive exactly (no float round trip).
        assert_eq!(
            one::<String>("SELECT payload::text FROM idem_claim('u1')").as_deref(),
            Some(r#"{"amount": 12.10}"#)
        );
    }

    #[pg_test]
    fn tokens_grow_with_each_claim() {
        let first = one::<i64>("SELECT token FROM idem_claim('u2', ttl => '1 microsecond')").unwrap();
        Spi::run("SELECT pg_sleep(0.01)").unwrap();
        let second = one::<i64>("SELECT token FROM idem_claim('u2')").unwrap();
        assert!(second > first, "{second} > {first}");
        assert_eq!(one::<i32>("SELECT attempts FROM idem_status('u2')"), Some(2));
    }

    #[pg_test]
    fn a_live_lease_is_in_progress() {
        Spi::run("SELECT idem_claim('u3')").unwrap();
        assert_eq!(one::<String>("SELECT outcome FROM idem_claim('u3')").as_deref(), Some("in_progress"));
    }

    #[pg_test]
    fn fingerprint_mismatch() {
        Spi::run("SELECT idem_claim('u4', fingerprint => 'a')").unwrap();
        assert_eq!(
            one::<String>("SELECT outcome FROM idem_claim('u4', fingerprint => 'b')").as_deref(),
            Some("mismatch")
        );
    }

    #[pg_test]
    fn retryable_failures_end_terminal_at_max_attempts() {
        Spi::run("SET LOCAL idempotency.max_attempts = 2").unwrap();
        Spi::run("SELECT idem_claim('u5')").unwrap();
        assert_eq!(one::<String>("SELECT idem_fail('u5', '{\"e\": 1}')").as_deref(), Some("released"));
        assert_eq!(one::<String>("SELECT status FROM idem_status('u5')").as_deref(), Some("pending"));
        assert_eq!(one::<String>("SELECT outcome FROM idem_claim('u5')").as_deref(), Some("claimed"));
        assert_eq!(one::<String>("SELECT idem_fail('u5', '{\"e\": 2}')").as_deref(), Some("failed"));
        assert_eq!(
            one::<String>("SELECT outcome || ' ' || payload::text FROM idem_claim('u5')").as_deref(),
            Some(r#"failed {"e": 2}"#)
        );
    }

    #[pg_test]
    fn once_is_true_once() {
        assert_eq!(one::<bool>("SELECT idem_once('u6')"), Some(true));
        assert_eq!(one::<bool>("SELECT idem_once('u6')"), Some(false));
        assert_eq!(one::<bool>("SELECT idem_once('u6', 'other')"), Some(true));
    }

    #[pg_test]
    fn scopes_are_separate() {
        Spi::run("SELECT idem_claim('u7', scope => 's1')").unwrap();
        assert_eq!(
            one::<String>("SELECT outcome FROM idem_claim('u7', scope => 's2')").as_deref(),
            Some("claimed")
        );
    }

    #[pg_test]
    fn partitions_cover_now_with_pg_partman_names() {
        // CREATE EXTENSION makes none (a restored dump brings its own); the first round does.
        assert_eq!(one::<i64>("SELECT count(*) FROM idempotency.partitions"), Some(0));
        assert_eq!(one::<i32>("SELECT partitions_created FROM idem_maintenance()"), Some(5));
        let name = one::<String>(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent = 'idempotency.records'::regclass ORDER BY c.relname LIMIT 1",
        )
        .unwrap();
        assert!(name.starts_with("records_p") && name.len() == "records_p2026_01_01".len(), "{name}");
        assert_eq!(one::<i32>("SELECT idempotency.premake_partitions(now())"), Some(0));
        assert!(one::<i32>("SELECT idempotency.premake_partitions(now() + interval '30 days')").unwrap() > 0);
    }

    #[pg_test(error = "idempotency: key must not be NULL")]
    fn null_key_is_an_error() {
        Spi::run("SELECT idem_claim(NULL)").unwrap();
    }

    #[pg_test(error = "idempotency: ttl must be positive, got 00:00:00")]
    fn zero_ttl_is_an_error() {
        Spi::run("SELECT idem_claim('u8', ttl => '0 s')").unwrap();
    }

    #[pg_test(error = "idempotency: key \"u9\" in scope \"default\" does not exist")]
    fn completing_an_unknown_key_is_an_error() {
        Spi::run("SELECT idem_complete('u9')").unwrap();
    }

    #[pg_test(error = "idempotency: key \"u10\" in scope \"default\" is already completed")]
    fn completing_twice_is_an_error() {
        Spi::run("SELECT idem_claim('u10')").unwrap();
        Spi::run("SELECT idem_complete('u10')").unwrap();
        Spi::run("SELECT idem_complete('u10')").unwrap();
    }

    #[pg_test(error = "idempotency: payload is 24 bytes, over the limit of 10")]
    fn oversized_payload_is_an_error() {
        Spi::run("SET LOCAL idempotency.max_payload_bytes = 10").unwrap();
        Spi::run("SELECT idem_claim('u11')").unwrap();
        Spi::run(r#"SELECT idem_complete('u11', '{"k": "abcdefg"}')"#).unwrap();
    }

    #[pg_test]
    fn offsets_are_a_high_water_mark() {
        assert_eq!(one::<bool>("SELECT idem_record_offset('g', 't', 0, 5)"), Some(true));
        assert_eq!(one::<bool>("SELECT idem_record_offset('g', 't', 0, 5)"), Some(false));
        assert_eq!(one::<bool>("SELECT idem_record_offset('g', 't', 0, 3)"), Some(false));
        assert_eq!(one::<i64>("SELECT idem_next_offset('g', 't', 0)"), Some(6));
        assert_eq!(one::<i64>("SELECT idem_next_offset('g', 't', 1)"), None);
        Spi::run("SELECT idem_reset_offset('g', 't', 0, 2)").unwrap();
        assert_eq!(one::<i64>("SELECT next_offset FROM idem_offsets('g')"), Some(2));
    }

    #[pg_test(
        error = "idempotency: consumer fenced on group \"g\" topic \"t\" partition 0: generation 1 is older than the stored generation 2"
    )]
    fn an_older_generation_is_fenced() {
        Spi::run("SELECT idem_record_offset('g', 't', 0, 5, 2)").unwrap();
        Spi::run("SELECT idem_record_offset('g', 't', 0, 9, 1)").unwrap();
    }

    #[pg_test]
    fn a_batch_answers_in_input_order_and_repeats_do_not_claim() {
        Spi::run("SELECT idem_once('b2')").unwrap();
        assert_eq!(
            one::<String>(
                "SELECT string_agg(key || '=' || outcome, ',') FROM idem_claim_batch(ARRAY['b3','b2','b1','b3'])"
            )
            .as_deref(),
            Some("b3=claimed,b2=completed,b1=claimed,b3=in_progress")
        );
        assert_eq!(one::<i32>("SELECT idem_complete_batch(ARRAY['b1','b3'])"), Some(2));
        assert_eq!(
            one::<String>("SELECT string_agg(k, ',') FROM idem_once_batch(ARRAY['b1','b9','b9','b8']) k")
                .as_deref(),
            Some("b9,b8")
        );
    }

    #[pg_test(error = "idempotency: batch has 4 keys, over the limit of 3")]
    fn a_batch_over_the_limit_is_an_error() {
        Spi::run("SET LOCAL idempotency.max_batch_keys = 3").unwrap();
        Spi::run("SELECT idem_once_batch(ARRAY['1','2','3','4'])").unwrap();
    }

    #[pg_test]
    fn maintenance_drops_partitions_older_than_retention() {
        Spi::run("SELECT idempotency.premake_partitions(now() - interval '20 days')").unwrap();
        let old = "SELECT count(*) FROM idempotency.partitions WHERE range_to <= now() - interval '7 days'";
        assert!(one::<i64>(old).unwrap() >= 5);
        let dropped = one::<i32>("SELECT partitions_dropped FROM idem_maintenance(now())").unwrap();
        assert!(dropped >= 5, "{dropped}");
        assert_eq!(one::<i64>(old), Some(0));
    }

    #[pg_test]
    fn lookups_search_past_and_current_partitions_not_far_future_ones() {
        // Rows written by hand (as the owner) into partitions of 10 days ago, today and 3 days
        // ahead: the first two are duplicates, the last is in a partition premade for later,
        // which lookups do not search (no claim writes there before its time comes).
        Spi::run("SELECT idempotency.premake_partitions(now() - interval '10 days')").unwrap();
        Spi::run("SELECT idempotency.premake_partitions(now())").unwrap();
        Spi::run(
            "INSERT INTO idempotency.records (scope, key, status, created_at)
             VALUES ('default', 'past', 'completed', now() - interval '10 days'),
                    ('default', 'today', 'completed', now()),
                    ('default', 'later', 'completed', now() + interval '3 days')",
        )
        .unwrap();
        assert_eq!(one::<bool>("SELECT idem_once('past')"), Some(false));
        assert_eq!(one::<bool>("SELECT idem_once('today')"), Some(false));
        assert_eq!(one::<String>("SELECT outcome FROM idem_claim('past')").as_deref(), Some("completed"));
        assert_eq!(one::<bool>("SELECT idem_once('later')"), Some(true));
    }

    #[pg_test]
    fn the_caller_gets_its_role_and_search_path_back() {
        Spi::run("CREATE ROLE idem_unit_consumer IN ROLE idempotency_consumer").unwrap();
        Spi::run("CREATE SCHEMA idem_unit_elsewhere").unwrap();
        Spi::run("SET LOCAL search_path = idem_unit_elsewhere, public").unwrap();
        Spi::run("SET LOCAL ROLE idem_unit_consumer").unwrap();
        let schemas = "SELECT current_schemas(true)::text";
        let before = one::<String>(schemas);
        // Works without any privilege on the storage, and after a success or an ERROR caught
        // in a subtransaction the caller is still itself, with its own search path.
        assert_eq!(one::<bool>("SELECT public.idem_once('role-1')"), Some(true));
        assert_eq!(one::<String>("SELECT current_user::text").as_deref(), Some("idem_unit_consumer"));
        assert_eq!(one::<String>(schemas), before);
        Spi::run(
            "DO $$ BEGIN PERFORM public.idem_complete('never-claimed');
                  EXCEPTION WHEN no_data_found THEN NULL; END $$",
        )
        .unwrap();
        assert_eq!(one::<String>("SELECT current_user::text").as_deref(), Some("idem_unit_consumer"));
        assert_eq!(one::<String>(schemas), before);
        Spi::run("RESET ROLE").unwrap();
    }
}
