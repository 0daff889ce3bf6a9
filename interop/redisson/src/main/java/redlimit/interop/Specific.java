package redlimit.interop;

import org.redisson.api.RRateLimiter;
import org.redisson.api.RateType;

/** The operations whose Java API differs between the Redisson versions driven. */
interface Specific {
    String version();

    boolean trySetRate(RRateLimiter limiter, RateType mode, long rate, long intervalMs, long keepAliveMs);

    void setRate(RRateLimiter limiter, RateType mode, long rate, long intervalMs, long keepAliveMs);

    /** {@code setRate(RateLimiterArgs)}: 4.4 and later. */
    void setRateArgs(RRateLimiter limiter, RateType mode, long rate, long intervalMs, long keepAliveMs, boolean keepState);

    /** {@code updateRate(RateLimiterArgs)}: 4.4 and later. */
    boolean updateRate(RRateLimiter limiter, RateType mode, long rate, long intervalMs, long keepAliveMs, boolean keepState);

    boolean tryAcquireFor(RRateLimiter limiter, long permits, long timeoutMs);

    /** {@code release(permits)}: 3.52 and later. */
    void release(RRateLimiter limiter, long permits);
}
