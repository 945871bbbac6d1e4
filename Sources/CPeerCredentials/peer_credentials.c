#define _GNU_SOURCE
#include "peer_credentials.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

int bs_unix_peer_credentials(int fd, uint32_t *uid, uint32_t *gid, int32_t *pid) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -errno;
    if (len != sizeof cred) return -EPROTO;
    *uid = cred.uid;
    *gid = cred.gid;
    *pid = cred.pid;
    return 0;
}

int bs_tcp_socket_owner(int family, const uint8_t *src, uint16_t sport, const uint8_t *dst, uint16_t dport,
                        uint32_t *uid) {
    if (family != AF_INET && family != AF_INET6) return -EAFNOSUPPORT;
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0) return -errno;
    /* One answer is expected at once; a kernel that does not answer must not hold an accept up. */
    struct timeval timeout = {.tv_sec = 1, .tv_usec = 0};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }

    struct {
        struct nlmsghdr header;
        struct inet_diag_req_v2 request;
    } message;
    memset(&message, 0, sizeof message);
    message.header.nlmsg_len = sizeof message;
    message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    message.header.nlmsg_flags = NLM_F_REQUEST;
    message.header.nlmsg_seq = 1;
    message.request.sdiag_family = (uint8_t)family;
    message.request.sdiag_protocol = IPPROTO_TCP;
    message.request.idiag_states = ~0u;
    message.request.id.idiag_sport = htons(sport);
    message.request.id.idiag_dport = htons(dport);
    size_t length = family == AF_INET ? 4 : 16;
    memcpy(message.request.id.idiag_src, src, length);
    memcpy(message.request.id.idiag_dst, dst, length);
    message.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    message.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    if (sendto(fd, &message, sizeof message, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    union {
        struct nlmsghdr header;
        char bytes[8192];
    } reply;
    ssize_t n = recv(fd, &reply, sizeof reply, 0);
    int e = errno;
    close(fd);
    if (n < 0) return -e;
    for (struct nlmsghdr *h = &reply.header; NLMSG_OK(h, (unsigned int)n); h = NLMSG_NEXT(h, n)) {
        if (h->nlmsg_type == NLMSG_ERROR) {
            struct nlmsgerr *error = NLMSG_DATA(h);
            if (h->nlmsg_len < NLMSG_LENGTH(sizeof *error)) return -EPROTO;
            return error->error == 0 ? -ENOENT : error->error;
        }
        if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY && h->nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
            struct inet_diag_msg *found = NLMSG_DATA(h);
            /* Only a socket a process still holds has an owner: one its process closed (orphaned, or already a
               time-wait entry, which the kernel reports as uid 0) or a half-open request socket has no file
               (inode 0), and its uid says nothing about who sent the request. Not found, then. */
            if (found->idiag_inode == 0) return -ENOENT;
            *uid = found->idiag_uid;
            return 0;
        }
    }
    return -ENOENT;
}
