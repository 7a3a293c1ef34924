// Command consumer is a small message consumer built on the Go client (clients/go, package idem), in
// the two shapes of its README, against a queue that delivers at least once: duplicates, concurrent
// redeliveries, a transient failure and a poison message.
//
//   - orders, one-transaction mode (idem.Wrapper): each order's handler runs inside a pgx.Tx and writes
//     the business row (example_orders); the claim, the row and the stored response commit together.
//     A duplicate gets the stored response without running the handler; the poison order (a negative
//     amount) is an idem.Permanent error, recorded as terminal and dead-lettered.
//   - receipts, two-transaction mode (idem.Middleware over an idem.Guard): sending a receipt is a side
//     effect outside the database (a fake mailer) that takes longer than the lease, which heartbeats
//     keep alive. A duplicate delivered while the first is running gets idem.ErrInProgress and is
//     redelivered later; the mailer's first failure for one customer releases the key for a retry.
//
// It checks its own result (every order one row, every receipt sent once, every duplicate answered
// from the stored response) and exits 1 when it is wrong. Keys are fresh on every run (idem.Key over a
// run id and the message's identity), so it can run again on the same database.
//
//	consumer -dsn "host=/var/run/postgresql dbname=app"    (default: $IDEM_DSN, else libpq's PG* variables)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"

	"idempotency/clients/go/idem"
)

// the namespace of this consumer's keys (any fixed UUID of yours)
var namespace = uuid.MustParse("6c1f3e0a-2b8d-4f47-9a5e-1d2c3b4a5f60")

type order struct {
	ID     string
	Cents  int64
	Email  string
	copies int // deliveries of the same message (2: a duplicate)
}

// queue is an at-least-once broker: Redeliver puts a message back after a pause; Settle acknowledges it.
type queue[M any] struct {
	ch      chan M
	pending sync.WaitGroup
}

func newQueue[M any](msgs []M, copies func(M) int) *queue[M] {
	q := &queue[M]{ch: make(chan M, 4*len(msgs))}
	for _, m := range msgs {
		for i := 0; i < copies(m); i++ {
			q.pending.Add(1)
			q.ch <- m
		}
	}
	return q
}

func (q *queue[M]) Redeliver(m M)      { time.AfterFunc(150*time.Millisecond, func() { q.ch <- m }) }
func (q *queue[M]) Settle()            { q.pending.Done() }
func (q *queue[M]) Close()             { q.pending.Wait(); close(q.ch) }
func (q *queue[M]) Messages() <-chan M { return q.ch }

type counters struct {
	mu                                        sync.Mutex
	processed, replayed, deadLetters, retries int
}

func (c *counters) add(f *int) { c.mu.Lock(); *f++; c.mu.Unlock() }

func main() {
	dsn := flag.String("dsn", os.Getenv("IDEM_DSN"), "libpq connection string (empty: PG* environment variables)")
	flag.Parse()
	time.AfterFunc(2*time.Minute, func() { // a run that cannot settle its messages is a failure too
		fmt.Println("consumer: FAILED (not done after 2 minutes)")
		os.Exit(1)
	})
	ctx := context.Background()
	pool, err := pgxpool.Connect(ctx, *dsn)
	if err != nil {
		log.Fatalf("connect: %v", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_orders (
	    run text, order_id text, cents bigint, PRIMARY KEY (run, order_id))`); err != nil {
		log.Fatalf("setup: %v", err)
	}
	run := fmt.Sprint(time.Now().UnixNano())

	var orders []order
	for i := 1; i <= 12; i++ {
		o := order{ID: fmt.Sprintf("o-%02d", i), Cents: int64(1000 + i), Email: fmt.Sprintf("c%d@example.com", i), copies: 1}
		if i%3 == 0 {
			o.copies = 2 // a producer retry: the same message twice
		}
		if i == 7 {
			o.Cents = -5 // poison: no retry can cure it
		}
		orders = append(orders, o)
	}
	failed := true
	if placeOrders(ctx, pool, run, orders) && sendReceipts(ctx, pool, run, orders) {
		failed = false
	}
	if failed {
		fmt.Println("consumer: FAILED")
		os.Exit(1)
	}
	fmt.Println("consumer: OK")
}

// placeOrders: one-transaction mode with idem.Wrapper, four workers.
func placeOrders(ctx context.Context, pool *pgxpool.Pool, run string, orders []order) bool {
	w := &idem.Wrapper{DB: pool, Scope: "example-orders"}
	q := newQueue(orders, func(o order) int { return o.copies })
	var c counters
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range q.Messages() {
				key, _ := idem.Key(namespace, "order", run, o.ID)
				res, err := w.Run(ctx, key, func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
					if o.Cents <= 0 {
						return nil, idem.Permanent(fmt.Errorf("order %s: amount %d", o.ID, o.Cents))
					}
					if _, err := tx.Exec(ctx, `INSERT INTO example_orders VALUES ($1, $2, $3)`, run, o.ID, o.Cents); err != nil {
						return nil, err // rolled back to the savepoint, released for a retry
					}
					return map[string]interface{}{"order": o.ID, "cents": o.Cents}, nil
				})
				var he *idem.HandlerError
				switch {
				case err == nil && res.Replayed:
					c.add(&c.replayed)
					q.Settle()
				case err == nil:
					c.add(&c.processed)
					q.Settle()
				case errors.Is(err, idem.ErrFailed): // the claim said failed, or this run made it so
					c.add(&c.deadLetters)
					q.Settle()
				case errors.Is(err, idem.ErrInProgress) || errors.As(err, &he): // released: later
					c.add(&c.retries)
					q.Redeliver(o)
				default: // a database error: a real consumer would stop or back off
					log.Printf("order %s: %v", o.ID, err)
					c.add(&c.retries)
					q.Redeliver(o)
				}
			}
		}()
	}
	q.Close()
	wg.Wait()

	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM example_orders WHERE run = $1`, run).Scan(&rows); err != nil {
		log.Printf("count: %v", err)
		return false
	}
	want, dups := 0, 0
	for _, o := range orders {
		if o.Cents > 0 {
			want++
			dups += o.copies - 1
		}
	}
	fmt.Printf("orders: %d placed (%d rows), %d duplicates replayed, %d dead-lettered, %d redelivered\n",
		c.processed, rows, c.replayed, c.deadLetters, c.retries)
	return check(c.processed == want && rows == want && c.replayed == dups && c.deadLetters == 1,
		"orders: want %d placed and rows, %d replayed, 1 dead-lettered", want, dups)
}

// mailer is the side effect outside the database: slow, and failing once for one customer.
type mailer struct {
	mu     sync.Mutex
	sent   map[string]int
	failed map[string]bool
}

func (m *mailer) Send(ctx context.Context, to string) error {
	select {
	case <-time.After(500 * time.Millisecond): // longer than the lease: heartbeats keep it
	case <-ctx.Done(): // the lease was lost: stop
		return ctx.Err()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if to == "c2@example.com" && !m.failed[to] {
		m.failed[to] = true
		return errors.New("mail server: 421 try again later")
	}
	m.sent[to]++
	return nil
}

// sendReceipts: two-transaction mode with idem.Middleware over a Guard with heartbeats, four workers.
func sendReceipts(ctx context.Context, pool *pgxpool.Pool, run string, orders []order) bool {
	guard := &idem.Guard{Store: idem.PGStore{DB: pool}, Scope: "example-receipts",
		TTL: 300 * time.Millisecond, HeartbeatEvery: 100 * time.Millisecond}
	m := &mailer{sent: map[string]int{}, failed: map[string]bool{}}
	handle := idem.Middleware(guard,
		func(o order) string { k, _ := idem.Key(namespace, "receipt", run, o.ID); return k },
		func(ctx context.Context, o order) (interface{}, error) {
			if err := m.Send(ctx, o.Email); err != nil {
				return nil, err
			}
			return map[string]string{"sent_to": o.Email}, nil
		})
	q := newQueue(orders, func(o order) int { return o.copies })
	var c counters
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range q.Messages() {
				var he *idem.HandlerError
				switch err := handle(ctx, o); {
				case err == nil:
					c.add(&c.processed) // sent now, or a duplicate answered from the stored response
					q.Settle()
				case errors.Is(err, idem.ErrFailed):
					c.add(&c.deadLetters)
					q.Settle()
				case errors.Is(err, idem.ErrInProgress), errors.As(err, &he), errors.Is(err, idem.ErrLeaseLost):
					c.add(&c.retries) // in progress elsewhere, released after a failure, or taken over
					q.Redeliver(o)
				default:
					log.Printf("receipt %s: %v", o.ID, err)
					c.add(&c.retries)
					q.Redeliver(o)
				}
			}
		}()
	}
	q.Close()
	wg.Wait()

	deliveries, once := 0, true
	for _, o := range orders {
		deliveries += o.copies
		if m.sent[o.Email] != 1 {
			once = false
			log.Printf("receipt %s: sent %d times", o.ID, m.sent[o.Email])
		}
	}
	fmt.Printf("receipts: %d sent to %d customers, %d deliveries settled, %d redelivered\n",
		sum(m.sent), len(m.sent), c.processed, c.retries)
	return check(once && len(m.sent) == len(orders) && c.processed == deliveries && c.deadLetters == 0 && c.retries >= 1,
		"receipts: want each of %d sent once, %d deliveries settled, at least one retry", len(orders), deliveries)
}

func sum(m map[string]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}

func check(ok bool, format string, args ...interface{}) bool {
	if !ok {
		fmt.Printf("WRONG: "+format+"\n", args...)
	}
	return ok
}
