// Java: retries that end in a poison message routed to a dead-letter table (plain JDBC).
//
// Each delivery is ONE transaction (one-transaction mode):
//   BEGIN; idem_claim(key); SAVEPOINT work; <process>; idem_complete(key, result); COMMIT
// When processing throws, the work is rolled back to the savepoint and the failure itself is committed
// with idem_fail: 'released' lets the next delivery retry, and after idempotency.max_attempts the key
// turns 'failed', at which point the message goes to the dead_letters table in the same transaction.
// A later delivery of that key gets 'failed' from idem_claim and is not processed again.
//
// Messages come from standard input ("key<TAB>payload" lines, a stand-in for the broker: no Kafka
// client is packaged in Debian) and a released message is put back at the end of the queue, as a broker
// redelivers it. Run: examples/java/run
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Savepoint;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.HashSet;
import java.util.Set;

public class DeadLetter {
    record Message(String key, String payload) {}

    static final Set<String> flakyOnce = new HashSet<>();

    /** The business logic: store an invoice. Throws for bad input (poison) and once for "flaky:". */
    static String process(Connection db, Message m) throws SQLException {
        String amount = m.payload();
        if (amount.startsWith("flaky:")) {
            amount = amount.substring(6);
            if (flakyOnce.add(m.key())) {
                throw new IllegalStateException("upstream timeout");
            }
        }
        try (PreparedStatement st = db.prepareStatement(
                "INSERT INTO invoices (key, amount) VALUES (?, ?::numeric) RETURNING id")) {
            st.setString(1, m.key());
            st.setBigDecimal(2, new java.math.BigDecimal(amount)); // NumberFormatException: poison
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return "{\"invoice_id\": " + rs.getLong(1) + "}";
            }
        }
    }

    /** Handles one delivery; returns true when the message must be delivered again. */
    static boolean handle(Connection db, Message m) throws SQLException {
        try {
            String outcome;
            try (PreparedStatement st = db.prepareStatement("SELECT outcome FROM idem_claim(?)")) {
                st.setString(1, m.key());
                try (ResultSet rs = st.executeQuery()) {
                    rs.next();
                    outcome = rs.getString(1);
                }
            }
            if (!outcome.equals("claimed")) { // completed: a duplicate; failed: already dead-lettered
                System.out.printf("  %-9s %-8s skipped (%s)%n", m.key(), "", outcome);
                db.commit();
                return false;
            }
            Savepoint work = db.setSavepoint("work");
            try {
                String result = process(db, m);
                exec(db, "SELECT idem_complete(?, ?::jsonb)", m.key(), result);
                System.out.printf("  %-9s %-8s done %s%n", m.key(), "", result);
                db.commit();
                return false;
            } catch (RuntimeException e) {
                db.rollback(work); // the invoice insert is undone, the claim stays
                String error = "{\"error\": \"" + e.getClass().getSimpleName() + ": "
                        + String.valueOf(e.getMessage()).replace("\"", "'") + "\"}";
                String state = query(db, "SELECT idem_fail(?, ?::jsonb)", m.key(), error);
                if (state.equals("failed")) { // max_attempts reached: poison
                    exec(db, "INSERT INTO dead_letters (key, payload, error) VALUES (?, ?, ?::jsonb)",
                            m.key(), m.payload(), error);
                }
                System.out.printf("  %-9s %-8s %s: %s%n", m.key(), state, e.getClass().getSimpleName(),
                        state.equals("failed") ? "to the dead-letter table" : "retry later");
                db.commit();
                return state.equals("released");
            }
        } catch (SQLException e) {
            db.rollback();
            throw e;
        }
    }

    static String query(Connection db, String sql, String... args) throws SQLException {
        try (PreparedStatement st = db.prepareStatement(sql)) {
            for (int i = 0; i < args.length; i++) st.setString(i + 1, args[i]);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getString(1);
            }
        }
    }

    static void exec(Connection db, String sql, String... args) throws SQLException {
        try (PreparedStatement st = db.prepareStatement(sql)) {
            for (int i = 0; i < args.length; i++) st.setString(i + 1, args[i]);
            st.execute();
        }
    }

    public static void main(String[] argv) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + System.getenv("IDEM_PORT") + "/ex_java?user=postgres";
        Deque<Message> queue = new ArrayDeque<>();
        try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in))) {
            for (String line; (line = in.readLine()) != null; ) {
                if (line.isBlank() || line.startsWith("#")) continue;
                String[] kv = line.split("\t", 2);
                queue.add(new Message(kv[0], kv[1]));
            }
        }
        try (Connection db = DriverManager.getConnection(url)) {
            try (var st = db.createStatement()) {
                st.execute("CREATE TABLE invoices (id bigserial PRIMARY KEY, key text, amount numeric)");
                st.execute("CREATE TABLE dead_letters (key text PRIMARY KEY, payload text, error jsonb,"
                        + " at timestamptz DEFAULT now())");
                st.execute("SET idempotency.max_attempts = 3"); // the third failure is terminal
            }
            db.setAutoCommit(false);
            int deliveries = 0;
            while (!queue.isEmpty()) {
                Message m = queue.poll();
                deliveries++;
                if (handle(db, m)) queue.add(m); // redelivered after the others, as a broker would
            }
            db.setAutoCommit(true);
            String invoices = query(db, "SELECT count(*) || ' invoices, ' || count(DISTINCT key) || ' keys' FROM invoices");
            String dead = query(db, "SELECT string_agg(key, ',') FROM dead_letters");
            String attempts = query(db, "SELECT attempts::text FROM idem_status('inv-1004')");
            boolean ok = invoices.equals("6 invoices, 6 keys") && "inv-1004".equals(dead) && "3".equals(attempts);
            System.out.printf("java: %d deliveries, %s, dead letters [%s] after %s attempts: %s%n",
                    deliveries, invoices, dead, attempts, ok ? "OK" : "WRONG");
            System.exit(ok ? 0 : 1);
        }
    }
}
