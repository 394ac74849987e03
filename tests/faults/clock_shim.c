/* A process whose wall clock is off: with LD_PRELOAD, clock_gettime(CLOCK_REALTIME),
 * gettimeofday and time return the real time plus STATE_CLOCK_SKEW_S seconds (negative:
 * behind). Monotonic clocks are untouched, as on a host whose clock was set wrong. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long skew(void) {
    const char *s = getenv("STATE_CLOCK_SKEW_S");
    return s ? atol(s) : 0;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int (*real)(clockid_t, struct timespec *) = dlsym(RTLD_NEXT, "clock_gettime");
    int done = real(clock, ts);
    if (done == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        ts->tv_sec += skew();
    }
    return done;
}

int gettimeofday(struct timeval *tv, void *tz) {
    int (*real)(struct timeval *, void *) = dlsym(RTLD_NEXT, "gettimeofday");
    int done = real(tv, tz);
    if (done == 0 && tv != NULL) tv->tv_sec += skew();
    return done;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
