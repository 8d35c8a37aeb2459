/*
 * The kernel's floor under a one-record Produce (bench/broker.py's "floor" baseline): a server that does what
 * `shale serve` asks of the kernel per request and nothing else — epoll_wait, recv of the request frame, pwrite
 * of its bytes to a file, send of a canned 44-byte answer carrying the request's correlation id — so that its
 * CPU time per request is what any server pays on this machine before its own code runs.
 *
 *     floor_server PORT FILE     (on 127.0.0.1:PORT, one connection at a time, until killed)
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static char buf[1 << 20];

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PORT FILE\n", argv[0]);
        return 2;
    }
    int out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int listener = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (out < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(listener, 8) != 0) {
        perror("floor_server");
        return 1;
    }
    char answer[44] = {0};
    uint32_t answer_size = htonl(sizeof answer - 4);
    memcpy(answer, &answer_size, 4);
    off_t written = 0;
    for (;;) { /* one connection at a time: a readiness probe's, then the client's */
        int conn = accept(listener, NULL, NULL);
        if (conn < 0) {
            perror("accept");
            return 1;
        }
        setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fcntl(conn, F_SETFL, O_NONBLOCK);
        int poll = epoll_create1(0);
        struct epoll_event want = {.events = EPOLLIN, .data.fd = conn}, ready;
        epoll_ctl(poll, EPOLL_CTL_ADD, conn, &want);
        size_t have = 0;
        for (;;) {
            if (epoll_wait(poll, &ready, 1, -1) < 1) continue;
            ssize_t n = recv(conn, buf + have, sizeof buf - have, 0);
            if (n <= 0) break;
            have += (size_t)n;
            while (have >= 4) {
                uint32_t size;
                memcpy(&size, buf, 4);
                size = ntohl(size);
                if (size > sizeof buf - 4) return 1;
                if (have < 4 + (size_t)size) break;
                if (pwrite(out, buf + 4, size, written) != (ssize_t)size) return 1;
                written += size;
                memcpy(answer + 4, buf + 8, 4); /* the request's correlation id */
                if (send(conn, answer, sizeof answer, 0) != (ssize_t)sizeof answer) return 1;
                memmove(buf, buf + 4 + size, have - 4 - size);
                have -= 4 + size;
            }
        }
        close(poll);
        close(conn);
    }
}
