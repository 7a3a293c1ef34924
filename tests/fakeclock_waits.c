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
 *
 * The wall clock's reads, for a clock the test steps (IDEM_FAKECLOCK_FILE, tests/fakeclock.py: FileClock).
 * libfaketime can read its setting from a file (FAKETIME_TIMESTAMP_FILE) at every call, but it does so
 * with fopen, which allocates; PostgreSQL reads the clock in its SIGALRM handler (handle_sig_alarm ->
 * GetCurrentTimestamp), and an allocation in a handler that interrupted malloc or free corrupts the heap
 * (seen once: "malloc(): unsorted double linked list corrupted" in a backend running idem_maintenance(),
 * whose partition locks wait under lock_timeout). So libfaketime gets its setting from the environment
 * (FAKETIME, which it reads with getenv and parses without allocating), and here each read of the wall
 * clock first copies the file's line into that variable, with open/read/close, which are
 * async-signal-safe, and with every signal blocked, so that no handler runs inside libfaketime's parse.
 *
 * With IDEM_FAKECLOCK_STRICT=1 (the clock layer's server) an allocation inside the SIGALRM handler (the
 * timeouts', which reads the clock) aborts the process at once, with a line on stderr, instead of corrupting
 * the heap now and then: sigaction installs that handler behind one that counts the handlers running, and
 * malloc, calloc, realloc and free check the count. (Only SIGALRM's: PostgreSQL 15's postmaster does its work
 * in its other handlers, which run only while its main loop waits with signals unblocked.)
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
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
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

/* The wall clock: "FAKETIME=<the file's first line>", kept current by wall_clock_setting(); the server
 * starts with FAKETIME in its environment, so that libfaketime never looks for a file of its own. */
#define SETTING_MAX 96
static char faketime_env[sizeof("FAKETIME=") + SETTING_MAX] = "FAKETIME=+0";
static char clock_file[4096];
extern char **environ;
static int (*next_clock_gettime)(clockid_t, struct timespec *);
static int (*libc_clock_gettime)(clockid_t, struct timespec *);
static int (*next_gettimeofday)(struct timeval *, void *);
static time_t (*next_time)(time_t *);

/* Looked up once, at load: dlsym may allocate, so never in a handler. The file's name is copied, because
 * the postmaster overwrites the original environment's strings with its process title. */
__attribute__((constructor)) static void
fakeclock_init(void)
{
	const char *file = getenv("IDEM_FAKECLOCK_FILE");

	next_clock_gettime = (int (*)(clockid_t, struct timespec *)) dlsym(RTLD_NEXT, "clock_gettime");
	next_gettimeofday = (int (*)(struct timeval *, void *)) dlsym(RTLD_NEXT, "gettimeofday");
	next_time = (time_t (*)(time_t *)) dlsym(RTLD_NEXT, "time");
	libc_clock_gettime = (int (*)(clockid_t, struct timespec *)) glibc("clock_gettime");
	if (file != NULL && file[0] != '\0' && strlen(file) < sizeof(clock_file) && getenv("FAKETIME") != NULL)
		memcpy(clock_file, file, strlen(file) + 1);
}

/* Blocks every signal and copies the file's first line into FAKETIME; the caller restores *old. A file
 * that cannot be read, or an empty or too long line, leaves the last setting in force. */
static void
wall_clock_setting(sigset_t *old)
{
	sigset_t all;
	char buf[SETTING_MAX + 2];
	ssize_t n = 0;
	int fd;

	sigfillset(&all);
	sigprocmask(SIG_SETMASK, &all, old);
	if (clock_file[0] == '\0')
		return;
	fd = open(clock_file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	if (buf[0] != '\0' && strlen(buf) <= SETTING_MAX)
		memcpy(faketime_env + sizeof("FAKETIME=") - 1, buf, strlen(buf) + 1);
	/* The environment's FAKETIME is this buffer: set here rather than by putenv (which may allocate),
	 * and again after the postmaster moves the environment to copies of its strings. */
	for (char **e = environ; e != NULL && *e != NULL; e++)
		if (strncmp(*e, "FAKETIME=", sizeof("FAKETIME=") - 1) == 0)
		{
			*e = faketime_env;
			break;
		}
}

int
clock_gettime(clockid_t c, struct timespec *tp)
{
	sigset_t old;
	int r;

	/* The other clocks are not faked (FAKETIME_DONT_FAKE_MONOTONIC): read from glibc, not through libfaketime,
	 * which marks the thread "do not fake" around its own real read, so that a SIGALRM arriving then made
	 * the handler read the real wall clock. */
	if (c != CLOCK_REALTIME && c != CLOCK_REALTIME_COARSE)
		return (libc_clock_gettime != NULL ? libc_clock_gettime : next_clock_gettime)(c, tp);
	wall_clock_setting(&old);
	r = next_clock_gettime(c, tp);
	sigprocmask(SIG_SETMASK, &old, NULL);
	return r;
}

int
gettimeofday(struct timeval *tv, void *tz)
{
	sigset_t old;
	int r;

	wall_clock_setting(&old);
	r = next_gettimeofday(tv, tz);
	sigprocmask(SIG_SETMASK, &old, NULL);
	return r;
}

time_t
time(time_t *t)
{
	sigset_t old;
	time_t r;

	wall_clock_setting(&old);
	r = next_time(t);
	sigprocmask(SIG_SETMASK, &old, NULL);
	return r;
}

/* IDEM_FAKECLOCK_STRICT: no allocation inside the SIGALRM handler. */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static int strict = -1;                       /* -1: IDEM_FAKECLOCK_STRICT not looked at yet */
static __thread volatile sig_atomic_t in_handler;
static struct sigaction handlers[NSIG];       /* the program's own, behind counted() */

static void
counted(int signo, siginfo_t *info, void *context)
{
	struct sigaction *h = &handlers[signo];

	in_handler++;
	if (h->sa_flags & SA_SIGINFO)
		h->sa_sigaction(signo, info, context);
	else
		h->sa_handler(signo);
	in_handler--;
}

static void
check_allocation(const char *what)
{
	static const char msg[] = "fakeclock_waits: an allocation inside the SIGALRM handler (IDEM_FAKECLOCK_STRICT): ";

	if (in_handler > 0)
	{
		(void) write(2, msg, sizeof(msg) - 1);
		(void) write(2, what, strlen(what));
		(void) write(2, "\n", 1);
		abort();
	}
}

int
sigaction(int signo, const struct sigaction *act, struct sigaction *old)
{
	static int (*real)(int, const struct sigaction *, struct sigaction *);
	struct sigaction wrapped;
	struct sigaction prev;
	struct sigaction saved;
	int r;

	if (real == NULL)
		real = (int (*)(int, const struct sigaction *, struct sigaction *)) glibc("sigaction");
	if (strict < 0)
	{
		const char *v = getenv("IDEM_FAKECLOCK_STRICT");

		strict = v != NULL && strcmp(v, "1") == 0;
	}
	if (!strict || signo != SIGALRM)
		return real(signo, act, old);
	saved = handlers[signo];
	if (act == NULL || (!(act->sa_flags & SA_SIGINFO) && (act->sa_handler == SIG_DFL || act->sa_handler == SIG_IGN)))
	{
		r = real(signo, act, &prev);
		if (r == 0 && act != NULL)
			handlers[signo] = *act;
	}
	else
	{
		wrapped = *act;
		wrapped.sa_flags |= SA_SIGINFO;
		wrapped.sa_sigaction = counted;
		handlers[signo] = *act;
		r = real(signo, &wrapped, &prev);
		if (r != 0)
			handlers[signo] = saved;
	}
	/* The caller sees its own handler as the previous one, not counted(). */
	if (r == 0 && old != NULL)
		*old = (prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction == counted ? saved : prev;
	return r;
}

void *
malloc(size_t n)
{
	check_allocation("malloc");
	return __libc_malloc(n);
}

void *
calloc(size_t n, size_t size)
{
	check_allocation("calloc");
	return __libc_calloc(n, size);
}

void *
realloc(void *p, size_t n)
{
	check_allocation("realloc");
	return __libc_realloc(p, n);
}

void
free(void *p)
{
	check_allocation("free");
	__libc_free(p);
}
