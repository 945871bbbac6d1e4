/* What does libcurl's CURLOPT_AWS_SIGV4 sign? Each case sends one request to the local recording origin. */
#include <curl/curl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *body = "hello sigv4 body";
static size_t offset;
static size_t readcb(char *buf, size_t size, size_t n, void *ud) {
    size_t left = strlen(body) - offset, want = size * n;
    if (want > left) want = left;
    memcpy(buf, body + offset, want); offset += want; return want;
}
static void run(const char *label, const char *url, const char *provider, int mode, int token) {
    CURL *h = curl_easy_init();
    struct curl_slist *hs = NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, provider);
    curl_easy_setopt(h, CURLOPT_USERPWD, "AKIDEXAMPLE:wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY");
    if (token) hs = curl_slist_append(hs, "x-amz-security-token: SESSIONTOKEN");
    hs = curl_slist_append(hs, "Content-Type: text/plain");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hs);
    if (mode == 1) curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    if (mode == 2) {
        offset = 0;
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, readcb);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    fprintf(stderr, "case %s\n", label);
    printf("case %s rc=%d\n", label, curl_easy_perform(h)); fflush(stdout);
    if (mode == 3) { sleep(2); offset = 0; printf("case %s (same handle, 2 s later) rc=%d\n", label, curl_easy_perform(h)); }
    curl_slist_free_all(hs);
    curl_easy_cleanup(h);
}
int main(int argc, char **argv) {
    char base[256]; snprintf(base, sizeof base, "http://127.0.0.1:%s", argv[1]);
    char url[512];
    printf("%s\n", curl_version());
    snprintf(url, sizeof url, "%s/plain", base);
    run("get-plain", url, "aws:amz:eu-west-1:execute-api", 0, 0);
    run("get-token", url, "aws:amz:eu-west-1:execute-api", 0, 1);
    snprintf(url, sizeof url, "%s/p?b=2&a=1&a=0", base);
    run("query-unsorted-repeated", url, "aws:amz:eu-west-1:execute-api", 0, 0);
    snprintf(url, sizeof url, "%s/p?x=%%2F%%3D%%26&e=", base);
    run("query-reserved", url, "aws:amz:eu-west-1:execute-api", 0, 0);
    snprintf(url, sizeof url, "%s/a%%20b/c", base);
    run("path-space", url, "aws:amz:eu-west-1:execute-api", 0, 0);
    snprintf(url, sizeof url, "%s/post", base);
    run("postfields", url, "aws:amz:eu-west-1:execute-api", 1, 0);
    run("read-callback", url, "aws:amz:eu-west-1:execute-api", 2, 0);
    run("s3-get", url, "aws:amz:eu-west-1:s3", 0, 0);
    run("s3-read-callback", url, "aws:amz:eu-west-1:s3", 2, 0);
    snprintf(url, sizeof url, "%s/again", base);
    run("reuse", url, "aws:amz:eu-west-1:execute-api", 3, 0);
    return 0;
}
