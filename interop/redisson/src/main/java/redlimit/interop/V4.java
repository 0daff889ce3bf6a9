package redlimit.interop;

import java.time.Duration;

import org.redisson.api.RRateLimiter;
import org.redisson.api.RateType;
import org.redisson.api.ratelimiter.RateLimiterArgs;

/** Redisson 4.x: Durations, keepAliveTime, RateLimiterArgs, release. */
final class V4 implements Specific {
    @Override
    public String version() {
        return "4.7.0";
    }

    @Override
    public boolean trySetRate(RRateLimiter limiter, RateType mode, long rate, long intervalMs, long keepAliveMs) {
        return limiter.trySetRate(mode, rate, Duration.ofMillis(intervalMs), Duration.ofMillis(keepAliveMs));
    }

    @Override
    @SuppressWarnings("deprecation")
    public void setRate(RRateLimiter limiter, RateType mode, long rate, long intervalMs, long keepAliveMs) {
        limiter.setRate(mode, rate, Duration.ofMillis(intervalMs), Duration.ofMillis(keepAliveMs));
    }

    @Override
    public void setRateArgs(RRateLimiter limiter, RateType mode, long rate, long intervalMs, long keepAliveMs, boolean keepState) {
        limiter.setRate(args(mode, rate, intervalMs, keepAliveMs, keepState));
    }

    @Override
    public boolean updateRate(RRateLimiter limiter, RateType mode, long rate, long intervalMs, long keepAliveMs, boolean keepState) {
        return limiter.updateRate(args(mode, rate, intervalMs, keepAliveMs, keepState));
    }

    @Override
    public boolean tryAcquireFor(RRateLimiter limiter, long permits, long timeoutMs) {
        return limiter.tryAcquire(permits, Duration.ofMillis(timeoutMs));
    }

    @Override
    public void release(RRateLimiter limiter, long permits) {
        limiter.release(permits);
    }

    private static RateLimiterArgs args(RateType mode, long rate, long intervalMs, long keepAliveMs, boolean keepState) {
        return RateLimiterArgs.of(mode, rate, Duration.ofMillis(intervalMs))
                .keepAliveTime(Duration.ofMillis(keepAliveMs))
                .keepState(keepState);
    }
}
