/* Fault injection at the syscall boundary, for a process started with LD_PRELOAD.
 *
 * The kernel here has no device-mapper (its error target would give a real EIO), so the
 * C library's write, fsync, fdatasync, link, linkat, rename and renameat calls fail when
 * they touch a file below STATE_FAULT_DIR and STATE_FAULT lists them, as "op:errno" pairs
 * separated by commas: "write" (a file's write), "fsync" (a file's fsync), "link" (link or
 * linkat), "rename", "dirfsync" (the fsync of a directory, after the link). For example
 * "link:1,rename:5": link fails with EPERM, the rename that falls back on it with EIO.
 * Every other call goes to the C library untouched.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fault_errno;

static int armed(const char *op) {
    const char *spec = getenv("STATE_FAULT");
    size_t len = strlen(op);
    for (const char *at = spec; at != NULL && *at; at = strchr(at, ',') ? strchr(at, ',') + 1 : NULL) {
        if (strncmp(at, op, len) == 0 && at[len] == ':') {
            fault_errno = atoi(at + len + 1);
            return 1;
        }
    }
    return 0;
}

static int below(const char *path) {
    const char *dir = getenv("STATE_FAULT_DIR");
    return dir != NULL && path != NULL && strncmp(path, dir, strlen(dir)) == 0;
}

static int fd_below(int fd, int want_dir) {
    char link[64], path[PATH_MAX];
    struct stat st;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0 || fstat(fd, &st) != 0) return 0;
    path[n] = '\0';
    return below(path) && (S_ISDIR(st.st_mode) != 0) == want_dir;
}

static int fail(void) {
    errno = fault_errno;
    return -1;
}

#define NEXT(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

ssize_t write(int fd, const void *buf, size_t count) {
    if (armed("write") && fd_below(fd, 0)) return fail();
    return NEXT(write)(fd, buf, count);
}

int fsync(int fd) {
    if (armed("fsync") && fd_below(fd, 0)) return fail();
    if (armed("dirfsync") && fd_below(fd, 1)) return fail();
    return NEXT(fsync)(fd);
}

int fdatasync(int fd) {
    if (armed("fsync") && fd_below(fd, 0)) return fail();
    return NEXT(fdatasync)(fd);
}

int link(const char *from, const char *to) {
    if (armed("link") && below(to)) return fail();
    return NEXT(link)(from, to);
}

int linkat(int fromfd, const char *from, int tofd, const char *to, int flags) {
    if (armed("link") && below(to)) return fail();
    return NEXT(linkat)(fromfd, from, tofd, to, flags);
}

int rename(const char *from, const char *to) {
    if (armed("rename") && below(to)) return fail();
    return NEXT(rename)(from, to);
}

int renameat(int fromfd, const char *from, int tofd, const char *to) {
    if (armed("rename") && below(to)) return fail();
    return NEXT(renameat)(fromfd, from, tofd, to);
}
