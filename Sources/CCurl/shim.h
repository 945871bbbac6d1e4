#ifndef BACKSTOP_CCURL_SHIM_H
#define BACKSTOP_CCURL_SHIM_H

#include <curl/curl.h>
#include <errno.h>

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

static inline CURLcode bs_easy_setopt_seek_callback(CURL *h, bs_curl_seek_callback v) { return curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, v); }
static inline CURLcode bs_easy_getinfo_off(CURL *h, CURLINFO i, curl_off_t *v) { return curl_easy_getinfo(h, i, v); }
static inline CURLcode bs_easy_getinfo_long(CURL *h, CURLINFO i, long *v) { return curl_easy_getinfo(h, i, v); }
static inline CURLcode bs_easy_getinfo_pointer(CURL *h, CURLINFO i, void **v) { return curl_easy_getinfo(h, i, v); }

static inline CURLMcode bs_multi_setopt_long(CURLM *m, CURLMoption o, long v) { return curl_multi_setopt(m, o, v); }
static inline CURLMcode bs_multi_setopt_pointer(CURLM *m, CURLMoption o, void *v) { return curl_multi_setopt(m, o, v); }
static inline CURLMcode bs_multi_setopt_socket_callback(CURLM *m, bs_curl_socket_callback v) { return curl_multi_setopt(m, CURLMOPT_SOCKETFUNCTION, v); }
static inline CURLMcode bs_multi_setopt_timer_callback(CURLM *m, bs_curl_timer_callback v) { return curl_multi_setopt(m, CURLMOPT_TIMERFUNCTION, v); }

/* CURLMsg keeps its result in a union. */
static inline CURLcode bs_msg_result(const CURLMsg *msg) { return msg->data.result; }
static inline int bs_msg_is_done(const CURLMsg *msg) { return msg->msg == CURLMSG_DONE; }

static inline size_t bs_writefunc_pause(void) { return CURL_WRITEFUNC_PAUSE; }
static inline size_t bs_readfunc_pause(void) { return CURL_READFUNC_PAUSE; }
static inline size_t bs_readfunc_abort(void) { return CURL_READFUNC_ABORT; }


#endif
