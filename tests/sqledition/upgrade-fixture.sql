-- The synthetic next version the install tests upgrade to (tests/sqledition/run-*): written out as
-- idempotency--<version>--<version>.1.sql. It changes something observable and nothing else.
COMMENT ON SCHEMA idempotency IS 'idempotency SQL edition: synthetic upgrade of the install tests';
