/* libcurl's own cost per transfer, the way Backstop drives it, without Backstop: one easy handle reused for every
 * transfer on one keep-alive connection to a local origin, counted by callgrind (scripts/curl-cost.sh;
 * docs/performance.md#what-libcurl-costs-per-transfer).
 *
 *   curl-cost URL|CURLU COUNT PORT [HEADER_FILE]
 *
 * URL: CURLOPT_URL with the whole URL per transfer (what Backstop did before the URL handle); CURLU: a URL handle
 * holding the endpoint, only the path and the query set per transfer. HEADER_FILE: one header line per line, sent
 * through CURLOPT_HTTPHEADER. */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t sink(char *data, size_t size, size_t count, void *context) {
    (void)data; (void)context;
    return size * count;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: curl-cost URL|CURLU COUNT PORT [HEADER_FILE]\n"); return 2; }
    int useHandle = strcmp(argv[1], "CURLU") == 0;
    int count = atoi(argv[2]);
    char endpoint[64], url[256];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%s", argv[3]);
    snprintf(url, sizeof url, "%s/v1/users/42/orders?page=2&sort=-created_at", endpoint);
    if (curl_global_init(CURL_GLOBAL_ALL) != CURLE_OK) return 1;
    CURL *easy = curl_easy_init();
    CURLU *target = curl_url();
    if (!easy || !target || curl_url_set(target, CURLUPART_URL, endpoint, CURLU_PATH_AS_IS) != CURLUE_OK) return 1;
    struct curl_slist *headers = curl_slist_append(NULL, "Expect:");
    if (argc > 4) {
        FILE *file = fopen(argv[4], "r");
        char line[8192];
        if (!file) return 1;
        while (fgets(line, sizeof line, file)) {
            line[strcspn(line, "\r\n")] = 0;
            if (*line) headers = curl_slist_append(headers, line);
        }
        fclose(file);
    }
    curl_easy_setopt(easy, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(easy, CURLOPT_HTTP_CONTENT_DECODING, 0L);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
    for (int i = 0; i < count; i++) {
        if (useHandle) {
            curl_url_set(target, CURLUPART_PATH, "/v1/users/42/orders", 0);
            curl_url_set(target, CURLUPART_QUERY, "page=2&sort=-created_at", 0);
            curl_easy_setopt(easy, CURLOPT_CURLU, target);
        } else {
            curl_easy_setopt(easy, CURLOPT_URL, url);
        }
        CURLcode code = curl_easy_perform(easy);
        if (code != CURLE_OK) { fprintf(stderr, "transfer %d: %s\n", i, curl_easy_strerror(code)); return 1; }
    }
    curl_slist_free_all(headers);
    curl_url_cleanup(target);
    curl_easy_cleanup(easy);
    curl_global_cleanup();
    return 0;
}
