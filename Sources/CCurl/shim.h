#ifndef BACKSTOP_CCURL_SHIM_H
#define BACKSTOP_CCURL_SHIM_H

#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Swift cannot call C variadic functions, so every curl_easy_setopt /
 * curl_multi_setopt / curl_easy_getinfo use goes through a typed wrapper. */

typedef size_t (*bs_curl_data_callback)(char *, size_t, size_t, void *);
typedef int (*bs_curl_seek_callback)(void *, curl_off_t, int);
typedef int (*bs_curl_socket_callback)(CURL *, curl_socket_t, int, void *, void *);
typedef int (*bs_curl_timer_callback)(CURLM *, long, void *);

static inline CURLcode bs_easy_setopt_long(CURL *h, CURLoption o, long v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode bs_easy_setopt_off(CURL *h, CURLoption o, curl_off_t v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode bs_easy_setopt_string(CURL *h, CURLoption o, const char *v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode bs_easy_setopt_pointer(CURL *h, CURLoption o, void *v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode bs_easy_setopt_slist(CURL *h, CURLoption o, struct curl_slist *v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode bs_easy_setopt_data_callback(CURL *h, CURLoption o, bs_curl_data_callback v) { return curl_easy_setopt(h, o, v); }

/* A blob option (CURLOPT_SSLCERT_BLOB, CURLOPT_SSLKEY_BLOB): curl copies the bytes, so they need not outlive the call. */
static inline CURLcode bs_easy_setopt_blob(CURL *h, CURLoption o, const void *data, size_t len) {
    struct curl_blob blob = {(void *)data, len, CURL_BLOB_COPY};
    return curl_easy_setopt(h, o, &blob);
}

static inline CURLcode bs_easy_setopt_seek_callback(CURL *h, bs_curl_seek_callback v) { return curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, v); }
static inline CURLcode bs_easy_getinfo_off(CURL *h, CURLINFO i, curl_off_t *v) { return curl_easy_getinfo(h, i, v); }
static inline CURLcode bs_easy_getinfo_long(CURL *h, CURLINFO i, long *v) { return curl_easy_getinfo(h, i, v); }
static inline CURLcode bs_easy_getinfo_pointer(CURL *h, CURLINFO i, void **v) { return curl_easy_getinfo(h, i, v); }
static inline CURLcode bs_easy_getinfo_string(CURL *h, CURLINFO i, const char **v) { return curl_easy_getinfo(h, i, (char **)v); }

/* A share handle that shares TLS sessions and the DNS cache, or NULL. Every handle uses it, whichever multi handle it
   is in (the transport's or a connection group's), so they resume each other's sessions and resolve a name once.
   Used from the transport thread only, so it needs no locks. */
static inline CURLSH *bs_share_caches(void) {
    CURLSH *share = curl_share_init();
    if (share && (curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION) != CURLSHE_OK
                  || curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) != CURLSHE_OK)) {
        (void)curl_share_cleanup(share); /* a new share no handle uses: CURLSHE_OK */
        return NULL;
    }
    return share;
}

static inline CURLMcode bs_multi_setopt_long(CURLM *m, CURLMoption o, long v) { return curl_multi_setopt(m, o, v); }
static inline CURLMcode bs_multi_setopt_pointer(CURLM *m, CURLMoption o, void *v) { return curl_multi_setopt(m, o, v); }
static inline CURLMcode bs_multi_setopt_socket_callback(CURLM *m, bs_curl_socket_callback v) { return curl_multi_setopt(m, CURLMOPT_SOCKETFUNCTION, v); }
static inline CURLMcode bs_multi_setopt_timer_callback(CURLM *m, bs_curl_timer_callback v) { return curl_multi_setopt(m, CURLMOPT_TIMERFUNCTION, v); }

/* CURLMsg keeps its result in a union. */
static inline CURLcode bs_msg_result(const CURLMsg *msg) { return msg->data.result; }
static inline int bs_msg_is_done(const CURLMsg *msg) { return msg->msg == CURLMSG_DONE; }

static inline size_t bs_writefunc_pause(void) { return CURL_WRITEFUNC_PAUSE; }
static inline int bs_seekfunc_ok(void) { return CURL_SEEKFUNC_OK; }
static inline int bs_seekfunc_cantseek(void) { return CURL_SEEKFUNC_CANTSEEK; }

/* The name of an option, for error messages (NULL when curl does not know it). */
static inline const char *bs_easy_option_name(CURLoption option) {
    const struct curl_easyoption *o = curl_easy_option_by_id(option);
    return o ? o->name : NULL;
}

static inline size_t bs_readfunc_pause(void) { return CURL_READFUNC_PAUSE; }
static inline size_t bs_readfunc_abort(void) { return CURL_READFUNC_ABORT; }

static inline CURLMcode bs_multi_setopt_socket_data(CURLM *m, void *v) { return curl_multi_setopt(m, CURLMOPT_SOCKETDATA, v); }
static inline CURLMcode bs_multi_setopt_timer_data(CURLM *m, void *v) { return curl_multi_setopt(m, CURLMOPT_TIMERDATA, v); }
static inline curl_socket_t bs_socket_timeout(void) { return CURL_SOCKET_TIMEOUT; }

/* The transport's own event loop: epoll for curl's sockets, an eventfd for wake-ups. epoll_event is a packed
 * struct on x86_64, so Swift never touches it: these wrappers take and return plain integers. */

/* Watches `fd` for curl's CURL_POLL_IN / OUT / INOUT (`what`). `add` says whether the caller believes `fd` is
 * not registered yet; when it is wrong (ENOENT / EEXIST), the other operation is tried. */
static inline int bs_epoll_watch(int ep, int fd, int what, int add) {
    struct epoll_event ev;
    ev.events = 0;
    if (what == CURL_POLL_IN || what == CURL_POLL_INOUT) ev.events |= EPOLLIN;
    if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT) ev.events |= EPOLLOUT;
    ev.data.u64 = (uint64_t)(uint32_t)fd;
    if (epoll_ctl(ep, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev) == 0) return 0;
    if (errno != (add ? EEXIST : ENOENT)) return -1;
    return epoll_ctl(ep, add ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev);
}

static inline int bs_epoll_unwatch(int ep, int fd) {
    struct epoll_event ev = {0};
    return epoll_ctl(ep, EPOLL_CTL_DEL, fd, &ev);
}

/* How many ready sockets one epoll_wait reports at most (the Swift side sizes its arrays with it). */
#define BS_EPOLL_BATCH 256

/* Waits up to `timeout_ms` (-1: forever); fills `fds` and curl's CURL_CSELECT_* `masks`; returns the count. */
static inline int bs_epoll_wait(int ep, int *fds, int *masks, int capacity, int timeout_ms) {
    struct epoll_event events[BS_EPOLL_BATCH];
    if (capacity > BS_EPOLL_BATCH) capacity = BS_EPOLL_BATCH;
    int n = epoll_wait(ep, events, capacity, timeout_ms);
    for (int i = 0; i < n; i++) {
        int mask = 0;
        uint32_t e = events[i].events;
        if (e & EPOLLIN) mask |= CURL_CSELECT_IN;
        if (e & EPOLLOUT) mask |= CURL_CSELECT_OUT;
        if (e & (EPOLLERR | EPOLLHUP)) mask |= CURL_CSELECT_ERR;
        fds[i] = (int)(uint32_t)events[i].data.u64;
        masks[i] = mask;
    }
    return n;
}

/* Sockets for curl's connections are opened and closed by the transport (so it knows when a number is reused):
 * opened as curl itself would, plus close-on-exec. */
typedef curl_socket_t (*bs_curl_opensocket_callback)(void *, curlsocktype, struct curl_sockaddr *);
typedef int (*bs_curl_closesocket_callback)(void *, curl_socket_t);
/* The open callback gets the transfer (set per use: it checks the destination for that transfer); the close
 * callback gets the transport (a connection outlives the transfer that opened it). */
static inline CURLcode bs_easy_setopt_socket_callbacks(CURL *h, bs_curl_opensocket_callback open_cb,
                                                       bs_curl_closesocket_callback close_cb, void *close_context) {
    CURLcode rc = curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, open_cb);
    if (rc == CURLE_OK) rc = curl_easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, close_cb);
    if (rc == CURLE_OK) rc = curl_easy_setopt(h, CURLOPT_CLOSESOCKETDATA, close_context);
    return rc;
}
/* The address curl is about to connect to: copies 4 (IPv4) or 16 (IPv6) bytes into `out`, the port into `port`;
 * returns the byte count, 0 for another family. */
static inline int bs_sockaddr_bytes(const struct curl_sockaddr *a, uint8_t *out, int *port) {
    if (a->family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&a->addr;
        memcpy(out, &in->sin_addr, 4);
        *port = ntohs(in->sin_port);
        return 4;
    }
    if (a->family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&a->addr;
        memcpy(out, &in6->sin6_addr, 16);
        *port = ntohs(in6->sin6_port);
        return 16;
    }
    return 0;
}
static inline curl_socket_t bs_open_socket(const struct curl_sockaddr *a) {
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}
static inline curl_socket_t bs_socket_bad(void) { return CURL_SOCKET_BAD; }

static inline int bs_wake_fd_create(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }
/* Adds one to the eventfd: 0, or the errno. EAGAIN (the counter at its maximum) still leaves it readable, so the
 * sleeper wakes anyway; the caller treats it as success. */
static inline int bs_wake_fd_signal(int fd) {
    uint64_t one = 1;
    return write(fd, &one, sizeof one) == (ssize_t)sizeof one ? 0 : errno;
}
/* Resets the eventfd's counter: 0, or the errno (EAGAIN: it was already 0, another wake drained it). */
static inline int bs_wake_fd_drain(int fd) {
    uint64_t v;
    return read(fd, &v, sizeof v) == (ssize_t)sizeof v ? 0 : errno;
}

/* Names the calling thread for the kernel (top -H, perf, core dumps); at most 15 bytes are kept. 0 or the errno. */
static inline int bs_set_thread_name(const char *name) { return prctl(PR_SET_NAME, name, 0, 0, 0) == 0 ? 0 : errno; }

/* A CURLOPT_SSL_CTX_FUNCTION that turns on OpenSSL's read-ahead for the connection being made: a TLS record then
 * costs one recv() instead of two (its 5-byte header, then its body). Only for connections whose reader reads on
 * until OpenSSL has nothing (raw HTTP/1.1: records read ahead sit in OpenSSL's buffer, where no epoll reports them).
 * SSL_CTX_ctrl is looked up at run time like X509_verify_cert_error_string below; without it nothing changes. */
typedef long (*bs_ssl_ctx_ctrl_fn)(void *, int, long, void *);
static inline CURLcode bs_ssl_ctx_read_ahead(CURL *curl, void *ssl_ctx, void *userptr) {
    (void)curl;
    (void)userptr;
    /* Once per TLS connection, next to a handshake: the lookup's cost does not matter, and no state is shared. */
    bs_ssl_ctx_ctrl_fn ctrl = (bs_ssl_ctx_ctrl_fn)dlsym(RTLD_DEFAULT, "SSL_CTX_ctrl");
    if (ctrl) (void)ctrl(ssl_ctx, 41 /* SSL_CTRL_SET_READ_AHEAD */, 1, NULL); /* returns the previous setting */
    return CURLE_OK;
}
static inline CURLcode bs_easy_setopt_tls_read_ahead(CURL *h) {
    return curl_easy_setopt(h, CURLOPT_SSL_CTX_FUNCTION, bs_ssl_ctx_read_ahead);
}

/* OpenSSL's text for an X509 verification result (CURLINFO_SSL_VERIFYRESULT), e.g. "unable to get local issuer
 * certificate"; NULL when libcrypto is not in the process. Looked up at run time: libcurl brings libcrypto in, and
 * linking it directly would need libssl-dev's unversioned library at build time. */
static inline const char *bs_x509_verify_text(long result) {
    typedef const char *(*verify_text_fn)(long);
    static verify_text_fn fn = NULL;
    static int looked = 0;
    if (!looked) {
        fn = (verify_text_fn)dlsym(RTLD_DEFAULT, "X509_verify_cert_error_string");
        looked = 1;
    }
    return fn ? fn(result) : NULL;
}

/* CLOCK_MONOTONIC in milliseconds. */
static inline int64_t bs_monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* CURLINFO_ACTIVESOCKET takes a curl_socket_t (an int), not a long. CURL_SOCKET_BAD when the handle has no
 * connection (any more). */
static inline curl_socket_t bs_easy_active_socket(CURL *h) {
    curl_socket_t fd = CURL_SOCKET_BAD;
    if (curl_easy_getinfo(h, CURLINFO_ACTIVESOCKET, &fd) != CURLE_OK) return CURL_SOCKET_BAD;
    return fd;
}

/* send(2) on a connected socket without SIGPIPE: the bytes sent, or -errno (the raw HTTP/1.1 path's plain
 * connections, after curl connected them). */
static inline long bs_send(int fd, const void *buf, size_t len) {
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
    return n >= 0 ? (long)n : -(long)errno;
}

/* recv(2): the bytes read (0: end of stream), or -errno. */
static inline long bs_recv(int fd, void *buf, size_t len) {
    ssize_t n = recv(fd, buf, len, 0);
    return n >= 0 ? (long)n : -(long)errno;
}

#endif
