package redlimit.interop;

import java.util.concurrent.TimeUnit;

import org.redisson.api.RRateLimiter;
import org.redisson.api.RateIntervalUnit;
import org.redisson.api.RateType;

/** Redisson 3.24.3: intervals as a number and a unit, no keepAliveTime, no release. */
final class V3 implements Specific {
    @Override
    public String version() {
        return "3.24.3";
    }

    @Override
    public boolean trySetRate(RRateLimiter limiter, RateType mode, long rate, long intervalMs, long keepAliveMs) {
        refuseKeepAlive(keepAliveMs);
        return limiter.trySetRate(mode, rate, intervalMs, RateIntervalUnit.MILLISECONDS);
    }

    @Override
    public void setRate(RRateLimiter limiter, RateType mode, long rate, long intervalMs, long keepAliveMs) {
        refuseKeepAlive(keepAliveMs);
        limiter.setRate(mode, rate, intervalMs, RateIntervalUnit.MILLISECONDS);
    }

    @Override
    public void setRateArgs(RRateLimiter limiter, RateType mode, long rate, long intervalMs, long keepAliveMs, boolean keepState) {
        throw new UnsupportedOperationException("Redisson 3.24.3 has no setRate(RateLimiterArgs)");
    }

    @Override
    public boolean updateRate(RRateLimiter limiter, RateType mode, long rate, long intervalMs, long keepAliveMs, boolean keepState) {
        throw new UnsupportedOperationException("Redisson 3.24.3 has no updateRate");
    }

    @Override
    public boolean tryAcquireFor(RRateLimiter limiter, long permits, long timeoutMs) {
        return limiter.tryAcquire(permits, timeoutMs, TimeUnit.MILLISECONDS);
    }

    @Override
    public void release(RRateLimiter limiter, long permits) {
        throw new UnsupportedOperationException("Redisson 3.24.3 has no release");
    }

    private static void refuseKeepAlive(long keepAliveMs) {
        if (keepAliveMs != 0) {
            throw new UnsupportedOperationException("Redisson 3.24.3 has no keepAliveTime");
        }
    }
}
