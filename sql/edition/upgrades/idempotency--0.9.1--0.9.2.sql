-- The SQL edition, 0.9.1 -> 0.9.2 (issue 32: a week of keys). Nothing stored changes: idem_once_batch and
-- idem_claim_batch are replaced. Where the sealed partitions have key filters, they compute each key's hash
-- once, in a subquery of its own, instead of once for the filters' index condition and again for every row
-- of the key's bucket (the hash inlined into both). Run by the 0.9.2 plain script over a 0.9.1 install, or by
-- ALTER EXTENSION idempotency UPDATE after the 0.9.2 idempotency-tle.sql registered this path; in either case
-- one transaction, in the schema of the install.

-- Every function that changed in 0.9.2, from the sources.
--@include 40-batch.sql: idem_claim_batch idem_once_batch
--@include 90-finalize.sql
