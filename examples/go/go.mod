module idempotency/examples/go

go 1.19

require (
	github.com/google/uuid v1.3.0
	github.com/jackc/chunkreader/v2 v2.0.1
	github.com/jackc/pgconn v1.11.0
	github.com/jackc/pgio v1.0.0
	github.com/jackc/pgpassfile v1.0.0
	github.com/jackc/pgproto3/v2 v2.2.0
	github.com/jackc/pgservicefile v0.0.0-20200714003250-2b9c44734f2b
	github.com/jackc/pgtype v1.10.0
	github.com/jackc/pgx/v4 v4.15.0
	github.com/jackc/puddle v1.2.1
	golang.org/x/crypto v0.4.0
	golang.org/x/text v0.7.0
	idempotency/clients/go/idem v0.1.0
)

replace idempotency/clients/go/idem => ../../clients/go
