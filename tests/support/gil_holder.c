/* A native call that keeps the GIL: loaded with ctypes.PyDLL (which, unlike ctypes.CDLL, does
   not release the GIL around a call), rwn_hold_gil sleeps in C for the given seconds, resuming
   after signals, so no Python thread of the process can run meanwhile. Built at test time by
   tests/e2e/test_hang_evidence.py. */
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Holds the GIL until `path` exists (a test releases it once its hang is named) or `seconds`
   have passed; a NULL `path`: the seconds alone. */
void rwn_hold_gil_until(const char *path, double seconds) {
    double end = now_s() + seconds;
    while (now_s() < end && (path == 0 || access(path, F_OK) != 0)) {
        struct timespec pause = {0, 20 * 1000 * 1000};
        nanosleep(&pause, 0); /* EINTR (faulthandler's signal) just loops */
    }
}

void rwn_hold_gil(double seconds) { rwn_hold_gil_until(0, seconds); }

/* rwn_hold_gil_until, once it has created the empty file `ready`: a test then knows that the GIL
   is held (Python code before the call still runs). */
void rwn_hold_gil_ready(const char *ready, const char *path, double seconds) {
    int fd = open(ready, O_CREAT | O_WRONLY, 0600);
    if (fd >= 0) close(fd);
    rwn_hold_gil_until(path, seconds);
}
