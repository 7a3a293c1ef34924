-- Every partition of the record table with its range, what it holds, and when retention drops it.
-- (pg_partman's default partition, if any, has no range.) The range comes from the partition's catalog
-- bound (the row's own relpartbound, read in the statement's snapshot) through idempotency.partition_range,
-- never through a timestamp's text: pg_get_expr prints it under the
-- reader's DateStyle and TimeZone, and a zone abbreviation can read back hours away.
-- Every operator below has operands of exactly its types, and every function is qualified, so that no
-- object of the schema CREATE EXTENSION ran in is bound into the view (it runs as the storage's owner).
CREATE VIEW idempotency.partitions AS
SELECT c.oid::pg_catalog.regclass                             AS partition,
       b.range_from,
       b.range_to,
       GREATEST(c.reltuples, 0::pg_catalog.float4)::pg_catalog.int8 AS row_estimate,
       pg_catalog.pg_total_relation_size(c.oid)               AS total_bytes,
       pg_catalog.pg_size_pretty(pg_catalog.pg_total_relation_size(c.oid)) AS size,
       b.range_to OPERATOR(pg_catalog.+)
         pg_catalog.current_setting('idempotency.retention', true)::pg_catalog.interval AS dropped_after,
       s.sealed_at,
       s.blocks OPERATOR(pg_catalog.*) 32                     AS filter_bytes
  FROM pg_catalog.pg_inherits i
  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid
  LEFT JOIN idempotency.sealed s
         ON s.partition OPERATOR(pg_catalog.=) c.oid AND s.partition_name OPERATOR(pg_catalog.=) c.relname
  LEFT JOIN LATERAL idempotency.partition_range(c.relpartbound::pg_catalog.text) b ON true
 WHERE i.inhparent OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::pg_catalog.oid
 ORDER BY b.range_from NULLS LAST;

GRANT SELECT ON idempotency.partitions TO idempotency_admin, pg_monitor;
COMMENT ON VIEW idempotency.partitions IS 'Partitions of idempotency.records: range, estimated rows, size, when retention drops each, and when it was sealed (no new rows) with its filter''s size.';
