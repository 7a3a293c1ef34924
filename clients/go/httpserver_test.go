package idem_test

// The server processes of the HTTP tests (httpapp_test.go) and what the tests poll: started on the ports
// IDEM_HTTP_PORT and IDEM_HTTP_PORT+1 (clients/go/test takes them from tests/ports "clients-http"),
// killed with SIGKILL, frozen with SIGSTOP, restarted; readiness, the end of a killed server's database
// sessions and the end of a lease are polled, never waited for by the clock.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

type server struct {
	port    int
	url     string
	cmd     *exec.Cmd
	appName string
	starts  int
	log     string
}

var servers [2]*server

// httpServer is the i-th server (0 or 1), started at its first use (or again, after a test that killed it
// could not restart it) and stopped by TestMain.
func httpServer(t *testing.T, i int) *server {
	t.Helper()
	if servers[i] == nil {
		base, err := strconv.Atoi(os.Getenv("IDEM_HTTP_PORT"))
		if err != nil {
			t.Fatal("IDEM_HTTP_PORT is not set: run clients/go/test")
		}
		servers[i] = &server{port: base + i, url: fmt.Sprintf("http://127.0.0.1:%d", base+i),
			log: fmt.Sprintf("%s/idem-go-http-%d.log", os.TempDir(), base+i)}
	}
	if servers[i].cmd == nil {
		servers[i].start(t)
	}
	return servers[i]
}

func stopHTTPServers() {
	for _, s := range servers {
		if s != nil && s.cmd != nil {
			_ = s.cmd.Process.Kill()
			_ = s.cmd.Wait()
		}
	}
}

func (s *server) start(t *testing.T) {
	t.Helper()
	s.starts++
	s.appName = fmt.Sprintf("idem-http-%d-%d-%d", s.port, os.Getpid(), s.starts)
	flags := os.O_CREATE | os.O_WRONLY | os.O_APPEND
	if s.starts == 1 {
		flags |= os.O_TRUNC // this run's log only
	}
	log, err := os.OpenFile(s.log, flags, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	s.cmd = exec.Command(os.Args[0], "-test.run=^$")
	s.cmd.Env = append(os.Environ(), "IDEM_HTTP_SERVE="+strings.TrimPrefix(s.url, "http://"),
		"IDEM_HTTP_APP_NAME="+s.appName, "IDEM_HTTP_LEASE=3s")
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func(cmd *exec.Cmd) { _, _ = cmd.Process.Wait(); close(exited) }(s.cmd)
	poll(t, "the HTTP server to answer", func() bool {
		select {
		case <-exited:
			s.cmd = nil
			out, _ := os.ReadFile(s.log)
			t.Fatalf("the server on port %d exited: %s", s.port, out)
		default:
		}
		resp, err := http.Get(s.url + "/_test/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// kill: kill -9, then wait until PostgreSQL has ended every session of the process.
func (s *server) kill(t *testing.T) {
	t.Helper()
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
	poll(t, "the killed server's sessions to end", func() bool {
		return queryInt(t, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", s.appName) == 0
	})
}

func (s *server) signal(t *testing.T, sig syscall.Signal) {
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

func poll(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// queryOne is the one value of a one-row, one-column query.
func queryOne[T any](t *testing.T, sql string, args ...interface{}) T {
	t.Helper()
	var v T
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func queryInt(t *testing.T, sql string, args ...interface{}) int {
	return queryOne[int](t, sql, args...)
}

func queryBool(t *testing.T, sql string, args ...interface{}) bool {
	return queryOne[bool](t, sql, args...)
}

// counts: (handler runs, business rows) of a key in a scope.
func counts(t *testing.T, key, scope string) [2]int {
	t.Helper()
	return [2]int{queryInt(t, "SELECT count(*) FROM http_runs WHERE idem_key = $1 AND scope = $2", key, scope),
		queryInt(t, "SELECT count(*) FROM http_orders WHERE idem_key = $1 AND scope = $2", key, scope)}
}

type reply struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func sf(key string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

var client = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 100,
	MaxIdleConnsPerHost: 100}}

// post sends body (a JSON document) to url+path with the key (none for "") and the headers (pairs).
func post(url, path, key string, body interface{}, headers ...string) reply {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", url+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", sf(key))
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: out, err: err}
}

var book = map[string]string{"item": "book"}

func wantProblem(t *testing.T, r reply, status int, code string) map[string]interface{} {
	t.Helper()
	if r.err != nil || r.status != status {
		t.Fatalf("want %d %s, got %d %v: %s", status, code, r.status, r.err, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var doc map[string]interface{}
	if err := json.Unmarshal(r.body, &doc); err != nil {
		t.Fatal(err)
	}
	if doc["code"] != code || doc["status"] != float64(status) || doc["type"] != "about:blank" || doc["title"] == "" {
		t.Fatalf("problem %v", doc)
	}
	return doc
}

func wantReplay(t *testing.T, r, first reply) {
	t.Helper()
	if r.err != nil || r.status != first.status || !bytes.Equal(r.body, first.body) ||
		r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("not a replay of %d %s: %d %v %v %s", first.status, first.body, r.status, r.err, r.header, r.body)
	}
}
