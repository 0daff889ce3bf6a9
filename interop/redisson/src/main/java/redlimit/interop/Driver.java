package redlimit.interop;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import org.redisson.Redisson;
import org.redisson.api.RRateLimiter;
import org.redisson.api.RateLimiterConfig;
import org.redisson.api.RateType;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

/**
 * Runs Redisson's RRateLimiter on the orders it reads, one a line, from standard input,
 * and answers each on standard output, for the Rust tests to drive a real Redisson
 * client beside redlimit.
 *
 * <p>An order is {@code ID OPERATION ARGS...}, separated by single spaces. Each order
 * runs on a thread of its own, so a waiting one does not hold up the others, and is
 * answered by one line: {@code ID OK RESULT...} or {@code ID ERR CLASS: MESSAGE} (the
 * exception Redisson threw, its message on one line). The driver exits at the end of
 * its input. Operations (CLIENT names a connection made by {@code connect} or
 * {@code cluster}; MODE is OVERALL or PER_CLIENT; times are milliseconds):
 *
 * <pre>
 * version                                       -> OK REDISSON_VERSION
 * connect CLIENT redis://HOST:PORT              -> OK REDISSON_ID
 * cluster CLIENT redis://HOST:PORT,...          -> OK REDISSON_ID
 * close CLIENT                                  -> OK
 * trySetRate CLIENT NAME MODE RATE INTERVAL [KEEP_ALIVE]  -> OK true|false
 * setRate CLIENT NAME MODE RATE INTERVAL [KEEP_ALIVE]     -> OK
 * setRateArgs CLIENT NAME MODE RATE INTERVAL KEEP_ALIVE KEEP_STATE    -> OK (4.x)
 * updateRate CLIENT NAME MODE RATE INTERVAL KEEP_ALIVE KEEP_STATE     -> OK true|false (4.x)
 * tryAcquire CLIENT NAME PERMITS                -> OK true|false
 * tryAcquireFor CLIENT NAME PERMITS TIMEOUT     -> OK true|false ELAPSED
 * acquire CLIENT NAME PERMITS                   -> OK ELAPSED
 * release CLIENT NAME PERMITS                   -> OK (4.x)
 * available CLIENT NAME                         -> OK PERMITS
 * getConfig CLIENT NAME                         -> OK MODE RATE INTERVAL
 * expire CLIENT NAME TTL                        -> OK true|false
 * remainTimeToLive CLIENT NAME                  -> OK TTL
 * delete CLIENT NAME                            -> OK true|false
 * isExists CLIENT NAME                          -> OK true|false
 * run CLIENT NAME THREADS DURATION START [PERIOD]  -> OK GRANTS BEFORE-AFTER,...
 * </pre>
 *
 * <p>{@code run} starts THREADS threads at the epoch millisecond START (at once when
 * it has passed), until START + DURATION. Without PERIOD each calls
 * {@code tryAcquire(1, timeout)} with the time left, again and again (Redisson's
 * waiting); with PERIOD each calls {@code tryAcquire(1)} (no waiting) once every
 * PERIOD ms, thread i from START + i * PERIOD / THREADS on. It answers every grant with the clock read just before the call that got
 * it and just after it returned.
 */
public final class Driver {
    private static final PrintStream OUT =
            new PrintStream(System.out, true, StandardCharsets.UTF_8);
    private static final Map<String, RedissonClient> CLIENTS = new ConcurrentHashMap<>();
    private static final ExecutorService ORDERS = Executors.newCachedThreadPool();
    private static Specific specific;

    private Driver() {}

    public static void main(String[] args) throws Exception {
        specific = loadSpecific();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String order = line.trim();
            if (order.isEmpty()) {
                continue;
            }
            ORDERS.submit(() -> answer(order));
        }
        ORDERS.shutdown();
        ORDERS.awaitTermination(60, TimeUnit.SECONDS);
        for (RedissonClient client : CLIENTS.values()) {
            client.shutdown();
        }
        System.exit(0);
    }

    /** The operations of the Redisson version this jar was built with. */
    private static Specific loadSpecific() throws Exception {
        for (String name : new String[] {"redlimit.interop.V4", "redlimit.interop.V3"}) {
            try {
                return (Specific) Class.forName(name).getDeclaredConstructor().newInstance();
            } catch (ClassNotFoundException absent) {
                // the other version's module
            }
        }
        throw new IllegalStateException("built without V3 or V4");
    }

    private static void answer(String order) {
        String[] words = order.split(" ");
        String id = words[0];
        String reply;
        try {
            reply = "OK" + run(words);
        } catch (Throwable e) {
            Throwable cause = e;
            while (cause.getCause() != null && cause.getMessage() == null) {
                cause = cause.getCause();
            }
            reply = "ERR " + cause.getClass().getName() + ": "
                    + String.valueOf(cause.getMessage()).replace('\n', ' ').replace('\r', ' ');
        }
        synchronized (OUT) {
            OUT.println(id + " " + reply);
        }
    }

    private static String run(String[] w) throws Exception {
        String op = w[1];
        switch (op) {
            case "version":
                return " " + specific.version();
            case "connect": {
                Config config = new Config();
                config.useSingleServer()
                        .setAddress(w[3])
                        .setConnectionMinimumIdleSize(2)
                        .setConnectionPoolSize(40);
                return connect(w[2], config);
            }
            case "cluster": {
                Config config = new Config();
                config.useClusterServers()
                        .addNodeAddress(w[3].split(","))
                        .setMasterConnectionMinimumIdleSize(2)
                        .setMasterConnectionPoolSize(40)
                        .setSlaveConnectionMinimumIdleSize(1);
                return connect(w[2], config);
            }
            case "close": {
                RedissonClient client = CLIENTS.remove(w[2]);
                if (client != null) {
                    client.shutdown();
                }
                return "";
            }
            default:
                break;
        }
        RRateLimiter limiter = client(w[2]).getRateLimiter(w[3]);
        switch (op) {
            case "trySetRate":
                return " " + specific.trySetRate(limiter, mode(w[4]), num(w[5]), num(w[6]), w.length > 7 ? num(w[7]) : 0);
            case "setRate":
                specific.setRate(limiter, mode(w[4]), num(w[5]), num(w[6]), w.length > 7 ? num(w[7]) : 0);
                return "";
            case "setRateArgs":
                specific.setRateArgs(limiter, mode(w[4]), num(w[5]), num(w[6]), num(w[7]), Boolean.parseBoolean(w[8]));
                return "";
            case "updateRate":
                return " " + specific.updateRate(limiter, mode(w[4]), num(w[5]), num(w[6]), num(w[7]), Boolean.parseBoolean(w[8]));
            case "tryAcquire":
                return " " + limiter.tryAcquire(num(w[4]));
            case "tryAcquireFor": {
                long started = System.currentTimeMillis();
                boolean granted = specific.tryAcquireFor(limiter, num(w[4]), num(w[5]));
                return " " + granted + " " + (System.currentTimeMillis() - started);
            }
            case "acquire": {
                long started = System.currentTimeMillis();
                limiter.acquire(num(w[4]));
                return " " + (System.currentTimeMillis() - started);
            }
            case "release":
                specific.release(limiter, num(w[4]));
                return "";
            case "available":
                return " " + limiter.availablePermits();
            case "getConfig": {
                RateLimiterConfig config = limiter.getConfig();
                return " " + config.getRateType() + " " + config.getRate() + " " + config.getRateInterval();
            }
            case "expire":
                return " " + limiter.expire(java.time.Duration.ofMillis(num(w[4])));
            case "remainTimeToLive":
                return " " + limiter.remainTimeToLive();
            case "delete":
                return " " + limiter.delete();
            case "isExists":
                return " " + limiter.isExists();
            case "run":
                return contend(limiter, (int) num(w[4]), num(w[5]), num(w[6]), w.length > 7 ? num(w[7]) : 0);
            default:
                throw new IllegalArgumentException("unknown operation " + op);
        }
    }

    private static String connect(String name, Config config) {
        RedissonClient client = Redisson.create(config);
        RedissonClient old = CLIENTS.put(name, client);
        if (old != null) {
            old.shutdown();
        }
        return " " + client.getId();
    }

    private static RedissonClient client(String name) {
        RedissonClient client = CLIENTS.get(name);
        if (client == null) {
            throw new IllegalArgumentException("no client " + name + "; connect it first");
        }
        return client;
    }

    private static RateType mode(String word) {
        return RateType.valueOf(word);
    }

    private static long num(String word) {
        return Long.parseLong(word);
    }

    private static String contend(RRateLimiter limiter, int threads, long duration, long start, long period)
            throws Exception {
        long end = start + duration;
        List<Thread> workers = new ArrayList<>();
        List<List<long[]>> grants = new ArrayList<>();
        List<Throwable> failures = new ArrayList<>();
        for (int i = 0; i < threads; i++) {
            List<long[]> mine = new ArrayList<>();
            grants.add(mine);
            // Paced threads ask in turn, spread evenly over the period.
            long first = start + (period > 0 ? i * period / threads : 0);
            Thread worker = new Thread(() -> {
                try {
                    long wait = first - System.currentTimeMillis();
                    if (wait > 0) {
                        Thread.sleep(wait);
                    }
                    long next = first;
                    while (true) {
                        long before = System.currentTimeMillis();
                        if (before >= end) {
                            return;
                        }
                        boolean granted = period > 0
                                ? limiter.tryAcquire(1)
                                : specific.tryAcquireFor(limiter, 1, end - before);
                        if (granted) {
                            mine.add(new long[] {before, System.currentTimeMillis()});
                        }
                        if (period > 0) {
                            next += period;
                            long pause = next - System.currentTimeMillis();
                            if (pause > 0) {
                                Thread.sleep(pause);
                            }
                        }
                    }
                } catch (Throwable e) {
                    synchronized (failures) {
                        failures.add(e);
                    }
                }
            });
            workers.add(worker);
            worker.start();
        }
        for (Thread worker : workers) {
            worker.join();
        }
        if (!failures.isEmpty()) {
            throw new IllegalStateException("a thread failed: " + failures.get(0), failures.get(0));
        }
        StringBuilder out = new StringBuilder();
        int count = 0;
        for (List<long[]> mine : grants) {
            for (long[] grant : mine) {
                out.append(count == 0 ? " " : ",").append(grant[0]).append('-').append(grant[1]);
                count++;
            }
        }
        return " " + count + (count == 0 ? " -" : out.toString());
    }
}
