#ifndef BACKSTOP_PEER_CREDENTIALS_H
#define BACKSTOP_PEER_CREDENTIALS_H

#include <stdint.h>

/* The peer of a connected unix socket: SO_PEERCRED. Returns 0, or -errno. */
int bs_unix_peer_credentials(int fd, uint32_t *uid, uint32_t *gid, int32_t *pid);

/* The owner (uid) of the TCP socket whose 4-tuple is (src, sport) -> (dst, dport), as the kernel's socket table
 * has it, asked with one NETLINK_SOCK_DIAG / inet_diag request for exactly that socket (no dump, no /proc).
 * `family` is AF_INET (4-byte addresses) or AF_INET6 (16-byte addresses); ports in host order.
 * Returns 0 and sets *uid, -ENOENT when no such socket exists, or -errno. */
int bs_tcp_socket_owner(int family, const uint8_t *src, uint16_t sport, const uint8_t *dst, uint16_t dport,
                        uint32_t *uid);

#endif
