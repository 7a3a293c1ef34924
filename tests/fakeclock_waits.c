/*
 * Preloaded before libfaketime into a test server (tests/fakeclock.py builds it): the server's waits and
 * stat calls go straight to glibc.
 *
 * libfaketime wraps these calls, and while the real call runs it marks the thread "do not fake", so any
 * clock reading during the call gets the real time. PostgreSQL waits for a lock, a latch or a client in
 * epoll_wait, and its timer signal (lock_timeout, deadlock_timeout, statement_timeout) arrives there: the
 * handler then read the real clock, compared it with a deadline set on the fake one, and rescheduled the
 * alarm by the difference. With the fake clock ahead of the real one no timeout ever fired during a wait
 * (a lock wait under lock_timeout = 500ms lasted until the holder committed); behind it, every pending
 * timeout fired at the first alarm. Here the calls never enter libfaketime, so the handler reads the same
 * fake clock as everything else. The cost: libfaketime no longer shortens these waits by its rate.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* glibc's own definition of a symbol, looked up in libc itself (not the next preloaded library). */
static void *
glibc(const char *name)
{
	static void *libc;

	if (libc == NULL)
		libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
	return libc == NULL ? NULL : dlsym(libc, name);
}

#define PASS(ret, name, params, args)                                    \
	ret name params                                                      \
	{                                                                    \
		static ret (*real) params;                                       \
		if (real == NULL)                                                \
			real = (ret (*) params) glibc(#name);                        \
		return real args;                                                \
	}

PASS(int, epoll_wait, (int fd, struct epoll_event *ev, int n, int timeout), (fd, ev, n, timeout))
PASS(int, epoll_pwait, (int fd, struct epoll_event *ev, int n, int timeout, const sigset_t *mask),
	 (fd, ev, n, timeout, mask))
PASS(int, poll, (struct pollfd *fds, nfds_t n, int timeout), (fds, n, timeout))
PASS(int, ppoll, (struct pollfd *fds, nfds_t n, const struct timespec *t, const sigset_t *mask),
	 (fds, n, t, mask))
PASS(int, select, (int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *t), (n, r, w, e, t))
PASS(int, pselect, (int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *t, const sigset_t *mask),
	 (n, r, w, e, t, mask))
PASS(int, nanosleep, (const struct timespec *req, struct timespec *rem), (req, rem))
PASS(int, clock_nanosleep, (clockid_t c, int flags, const struct timespec *req, struct timespec *rem),
	 (c, flags, req, rem))
PASS(int, usleep, (useconds_t usec), (usec))
PASS(unsigned int, sleep, (unsigned int s), (s))
PASS(int, stat, (const char *path, struct stat *buf), (path, buf))
PASS(int, lstat, (const char *path, struct stat *buf), (path, buf))
PASS(int, fstat, (int fd, struct stat *buf), (fd, buf))
PASS(int, fstatat, (int dir, const char *path, struct stat *buf, int flags), (dir, path, buf, flags))
PASS(int, stat64, (const char *path, struct stat64 *buf), (path, buf))
PASS(int, lstat64, (const char *path, struct stat64 *buf), (path, buf))
PASS(int, fstat64, (int fd, struct stat64 *buf), (fd, buf))
PASS(int, fstatat64, (int dir, const char *path, struct stat64 *buf, int flags), (dir, path, buf, flags))
