/*
 * link_relay: a native UDP relay on loopback that imposes a link between a client and a
 * target (rate by serialization, one-way delay, seeded random loss, bounded queue), each
 * direction on its own. bench/native_relay.ts builds it with the system C compiler and drives
 * it; bench/link_emulator.ts is the same relay in TypeScript, kept as the fallback.
 *
 *   link_relay --listen PORT --target PORT [--rate BITS_PER_S] [--delay-us US] [--loss P]
 *              [--queue-bytes N] [--seed N] [--clients-max N] [--nice N]
 *   link_relay --ceiling PACKETS [--packet-bytes N] [--window N]   (measures itself, prints JSON)
 *
 * Relay mode prints "ready <port>" and then reads commands on stdin, one per line:
 *   shape <rate> <delay_us> <loss> <queue_bytes>   -> "ok"
 *   stats                                          -> "stats {json}"
 * End of stdin ends the relay. Packets are never delivered before their time; the lateness of
 * each delivery (scheduling, timer slack) is counted and reported so accuracy is stated.
 * Only 127.0.0.1 is ever used.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SLOT_BYTES 2048   /* QUIC here sends at most ~1.5 KB datagrams; larger are counted */
#define SLOTS 16384       /* per direction: the queue bound plus what is in propagation */
#define BATCH 64          /* datagrams per recvmmsg / sendmmsg */
#define CLIENTS_MAX 64

typedef struct {
  uint64_t at_ns;
  uint32_t len;
  uint16_t who; /* forward: client index (its upstream socket); backward: client index */
  uint8_t data[SLOT_BYTES];
} slot_t;

typedef struct {
  slot_t *slots;
  uint32_t head, tail; /* ring: head = next to deliver, tail = next free */
  uint64_t busy_until_ns;
  uint64_t rng;
  uint64_t packets, bytes, lost, queue_drops, ring_drops, oversize;
  uint64_t delivered, late_ns_sum, late_ns_max, late_over_100us;
} pipe_t;

typedef struct {
  double rate_bps;
  uint64_t delay_ns;
  double loss;
  uint64_t queue_bytes;
} shape_t;

static shape_t g_shape;
static int g_listener = -1;
static struct sockaddr_in g_target;
static int g_up[CLIENTS_MAX];
static struct sockaddr_in g_client[CLIENTS_MAX];
static int g_nclients = 0, g_clients_max = 16;
static pipe_t g_fwd, g_bwd;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* splitmix64: a seeded, repeatable draw per direction */
static double draw(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0;
}

static void die(const char *what) {
  fprintf(stderr, "link_relay: %s: %s\n", what, strerror(errno));
  exit(2);
}

static int udp_socket(uint16_t port) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
  if (fd < 0) die("socket");
  int buf = 8 << 20;
  /* FORCE works as root; otherwise the plain call gets what the system allows */
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof buf) != 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) die("bind");
  return fd;
}

static uint16_t port_of(int fd) {
  struct sockaddr_in a;
  socklen_t n = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &n);
  return ntohs(a.sin_port);
}

static void pipe_init(pipe_t *p, uint64_t seed) {
  memset(p, 0, sizeof *p);
  p->slots = calloc(SLOTS, sizeof(slot_t));
  if (!p->slots) die("calloc");
  p->rng = seed;
}

/* Loss, then the queue bound, then serialization at the rate, then the delay. */
static void pipe_push(pipe_t *p, const uint8_t *data, uint32_t len, uint16_t who, uint64_t now) {
  if (len > SLOT_BYTES) {
    p->oversize++;
    return;
  }
  if (g_shape.loss > 0 && draw(&p->rng) < g_shape.loss) {
    p->lost++;
    return;
  }
  double ns_per_byte = 8e9 / g_shape.rate_bps;
  uint64_t start = p->busy_until_ns > now ? p->busy_until_ns : now;
  double waiting = (double)(start - now) / ns_per_byte;
  if (waiting + len > (double)g_shape.queue_bytes) {
    p->queue_drops++;
    return;
  }
  if (p->tail - p->head >= SLOTS) {
    p->ring_drops++;
    return;
  }
  p->busy_until_ns = start + (uint64_t)(len * ns_per_byte);
  slot_t *s = &p->slots[p->tail % SLOTS];
  s->at_ns = p->busy_until_ns + g_shape.delay_ns;
  s->len = len;
  s->who = who;
  memcpy(s->data, data, len);
  p->tail++;
  p->packets++;
  p->bytes += len;
}

/* Delivers every due packet at the head (FIFO), batching runs that share a socket. */
static void pipe_flush(pipe_t *p, int forward) {
  struct mmsghdr msgs[BATCH];
  struct iovec iov[BATCH];
  for (;;) {
    uint64_t now = now_ns();
    int n = 0, fd = -1;
    while (n < BATCH && p->head + n != p->tail) {
      slot_t *s = &p->slots[(p->head + n) % SLOTS];
      if (s->at_ns > now) break;
      int sfd = forward ? g_up[s->who] : g_listener;
      if (fd >= 0 && sfd != fd) break;
      fd = sfd;
      uint64_t late = now - s->at_ns;
      p->late_ns_sum += late;
      if (late > p->late_ns_max) p->late_ns_max = late;
      if (late > 100000) p->late_over_100us++;
      iov[n].iov_base = s->data;
      iov[n].iov_len = s->len;
      memset(&msgs[n].msg_hdr, 0, sizeof msgs[n].msg_hdr);
      msgs[n].msg_hdr.msg_iov = &iov[n];
      msgs[n].msg_hdr.msg_iovlen = 1;
      if (!forward) {
        msgs[n].msg_hdr.msg_name = &g_client[s->who];
        msgs[n].msg_hdr.msg_namelen = sizeof g_client[s->who];
      }
      n++;
    }
    if (n == 0) return;
    int sent = sendmmsg(fd, msgs, n, 0);
    if (sent < 0) sent = n; /* a full socket buffer on loopback: dropped, as a link would */
    p->delivered += n;
    p->head += n;
  }
}

static int client_index(const struct sockaddr_in *from) {
  for (int k = 0; k < g_nclients; k++) {
    if (g_client[k].sin_port == from->sin_port &&
        g_client[k].sin_addr.s_addr == from->sin_addr.s_addr)
      return k;
  }
  if (g_nclients >= g_clients_max) return -1;
  int fd = udp_socket(0);
  if (connect(fd, (struct sockaddr *)&g_target, sizeof g_target) != 0) die("connect");
  g_client[g_nclients] = *from;
  g_up[g_nclients] = fd;
  return g_nclients++;
}

static uint8_t g_rx[BATCH][SLOT_BYTES + 1];

static void receive_from(int fd, int client /* -1: the listener */) {
  struct mmsghdr msgs[BATCH];
  struct iovec iov[BATCH];
  struct sockaddr_in from[BATCH];
  for (int round = 0; round < 16; round++) {
    for (int k = 0; k < BATCH; k++) {
      iov[k].iov_base = g_rx[k];
      iov[k].iov_len = sizeof g_rx[k];
      memset(&msgs[k].msg_hdr, 0, sizeof msgs[k].msg_hdr);
      msgs[k].msg_hdr.msg_iov = &iov[k];
      msgs[k].msg_hdr.msg_iovlen = 1;
      msgs[k].msg_hdr.msg_name = &from[k];
      msgs[k].msg_hdr.msg_namelen = sizeof from[k];
    }
    int n = recvmmsg(fd, msgs, BATCH, MSG_DONTWAIT, NULL);
    if (n <= 0) return;
    uint64_t now = now_ns();
    for (int k = 0; k < n; k++) {
      if (client < 0) {
        int c = client_index(&from[k]);
        if (c >= 0) pipe_push(&g_fwd, g_rx[k], msgs[k].msg_len, (uint16_t)c, now);
      } else {
        pipe_push(&g_bwd, g_rx[k], msgs[k].msg_len, (uint16_t)client, now);
      }
    }
    if (n < BATCH) return;
  }
}

static void print_pipe(FILE *f, const char *name, const pipe_t *p) {
  fprintf(f,
          "\"%s\":{\"packets\":%llu,\"bytes\":%llu,\"lost\":%llu,\"queueDrops\":%llu,"
          "\"ringDrops\":%llu,\"oversize\":%llu,\"delivered\":%llu,\"lateUsMean\":%.1f,"
          "\"lateUsMax\":%.1f,\"lateOver100us\":%llu}",
          name, (unsigned long long)p->packets, (unsigned long long)p->bytes,
          (unsigned long long)p->lost, (unsigned long long)p->queue_drops,
          (unsigned long long)p->ring_drops, (unsigned long long)p->oversize,
          (unsigned long long)p->delivered,
          p->delivered ? p->late_ns_sum / 1e3 / p->delivered : 0.0, p->late_ns_max / 1e3,
          (unsigned long long)p->late_over_100us);
}

static char g_line[512];
static size_t g_line_len = 0;

/* Returns 0 at end of stdin. */
static int read_commands(void) {
  char buf[256];
  ssize_t n = read(0, buf, sizeof buf);
  if (n <= 0) return n < 0 && errno == EINTR;
  for (ssize_t k = 0; k < n; k++) {
    if (buf[k] != '\n') {
      if (g_line_len < sizeof g_line - 1) g_line[g_line_len++] = buf[k];
      continue;
    }
    g_line[g_line_len] = 0;
    g_line_len = 0;
    double rate, loss;
    unsigned long long delay_us, queue;
    if (sscanf(g_line, "shape %lf %llu %lf %llu", &rate, &delay_us, &loss, &queue) == 4) {
      g_shape.rate_bps = rate;
      g_shape.delay_ns = delay_us * 1000ull;
      g_shape.loss = loss;
      g_shape.queue_bytes = queue;
      printf("ok\n");
    } else if (strcmp(g_line, "stats") == 0) {
      printf("stats {");
      print_pipe(stdout, "forward", &g_fwd);
      printf(",");
      print_pipe(stdout, "backward", &g_bwd);
      printf(",\"clients\":%d}\n", g_nclients);
    } else {
      printf("error unknown command\n");
    }
    fflush(stdout);
  }
  return 1;
}

static volatile int g_stop = 0;

/* One event loop: receive both ways, deliver what is due, sleep until the next due packet. */
static void relay_loop(int with_stdin) {
  struct pollfd fds[CLIENTS_MAX + 2];
  while (!g_stop) {
    int nf = 0;
    fds[nf++] = (struct pollfd){.fd = g_listener, .events = POLLIN};
    if (with_stdin) fds[nf++] = (struct pollfd){.fd = 0, .events = POLLIN};
    int base = nf;
    for (int k = 0; k < g_nclients; k++) fds[nf++] = (struct pollfd){.fd = g_up[k], .events = POLLIN};
    uint64_t next = UINT64_MAX;
    if (g_fwd.head != g_fwd.tail) next = g_fwd.slots[g_fwd.head % SLOTS].at_ns;
    if (g_bwd.head != g_bwd.tail && g_bwd.slots[g_bwd.head % SLOTS].at_ns < next)
      next = g_bwd.slots[g_bwd.head % SLOTS].at_ns;
    struct timespec ts, *tp = NULL;
    if (next != UINT64_MAX) {
      uint64_t now = now_ns();
      uint64_t wait = next > now ? next - now : 0;
      ts.tv_sec = wait / 1000000000ull;
      ts.tv_nsec = wait % 1000000000ull;
      tp = &ts;
    } else if (!with_stdin) {
      ts.tv_sec = 0;
      ts.tv_nsec = 50000000;
      tp = &ts;
    }
    int r = ppoll(fds, nf, tp, NULL);
    if (r < 0 && errno != EINTR) die("ppoll");
    if (r > 0) {
      if (fds[0].revents & POLLIN) receive_from(g_listener, -1);
      if (with_stdin && (fds[1].revents & (POLLIN | POLLHUP))) {
        if (!read_commands()) return;
      }
      for (int k = base; k < nf; k++)
        if (fds[k].revents & POLLIN) receive_from(fds[k].fd, k - base);
    }
    pipe_flush(&g_fwd, 1);
    pipe_flush(&g_bwd, 0);
  }
}

/* ---- ceiling: a windowed sender and a sink (threads) through this relay, unshaped ---- */

static atomic_ullong c_received, c_received_bytes, c_last_ns;
static int c_sink_fd, c_echo;

static void *sink_thread(void *arg) {
  (void)arg;
  uint8_t buf[BATCH][SLOT_BYTES];
  struct mmsghdr msgs[BATCH];
  struct iovec iov[BATCH];
  struct sockaddr_in from[BATCH];
  while (!g_stop) {
    for (int k = 0; k < BATCH; k++) {
      iov[k] = (struct iovec){buf[k], SLOT_BYTES};
      memset(&msgs[k].msg_hdr, 0, sizeof msgs[k].msg_hdr);
      msgs[k].msg_hdr.msg_iov = &iov[k];
      msgs[k].msg_hdr.msg_iovlen = 1;
      msgs[k].msg_hdr.msg_name = &from[k];
      msgs[k].msg_hdr.msg_namelen = sizeof from[k];
    }
    struct pollfd pf = {.fd = c_sink_fd, .events = POLLIN};
    if (poll(&pf, 1, 20) <= 0) continue;
    int n = recvmmsg(c_sink_fd, msgs, BATCH, MSG_DONTWAIT, NULL);
    if (n <= 0) continue;
    if (c_echo) {
      for (int k = 0; k < n; k++)
        sendto(c_sink_fd, buf[k], msgs[k].msg_len, 0, (struct sockaddr *)&from[k], sizeof from[k]);
    }
    unsigned long long b = 0;
    for (int k = 0; k < n; k++) b += msgs[k].msg_len;
    atomic_fetch_add(&c_received_bytes, b);
    atomic_fetch_add(&c_received, (unsigned long long)n);
    atomic_store(&c_last_ns, now_ns());
  }
  return NULL;
}

static void *relay_thread(void *arg) {
  (void)arg;
  relay_loop(0);
  return NULL;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int run_ceiling(long packets, int packet_bytes, int window) {
  c_sink_fd = udp_socket(0);
  g_target.sin_family = AF_INET;
  g_target.sin_port = htons(port_of(c_sink_fd));
  g_target.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  g_listener = udp_socket(0);
  g_shape = (shape_t){.rate_bps = 1e12, .delay_ns = 0, .loss = 0, .queue_bytes = 1ull << 40};
  pipe_init(&g_fwd, 1);
  pipe_init(&g_bwd, 2);
  pthread_t relay, sink;
  pthread_create(&relay, NULL, relay_thread, NULL);
  pthread_create(&sink, NULL, sink_thread, NULL);
  int tx = udp_socket(0);
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port_of(g_listener))};
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(tx, (struct sockaddr *)&to, sizeof to) != 0) die("connect");
  uint8_t *payload = calloc(1, packet_bytes);
  /* Throughput: at most `window` datagrams in flight, so the figure is what the relay
   * sustains, not how fast a blast overflows a socket buffer. Stragglers count out after 200 ms. */
  uint64_t t0 = now_ns();
  long sent = 0;
  uint64_t stall_from = 0;
  while (sent < packets) {
    long inflight = sent - (long)atomic_load(&c_received);
    if (inflight < window) {
      if (send(tx, payload, packet_bytes, 0) == packet_bytes) sent++;
      stall_from = 0;
      continue;
    }
    uint64_t now = now_ns();
    if (!stall_from) stall_from = now;
    if (now - stall_from > 200000000ull) {
      atomic_store(&c_received, (unsigned long long)sent);
      stall_from = 0;
    }
    sched_yield();
  }
  usleep(200000);
  double secs = (double)(atomic_load(&c_last_ns) - t0) / 1e9;
  double bits = atomic_load(&c_received_bytes) * 8.0 / (secs > 0 ? secs : 1e-9);
  unsigned long long got = atomic_load(&c_received_bytes) / packet_bytes;
  /* RTT floor: one datagram at a time through the relay both ways to an echo (delay 0). */
  c_echo = 1;
  enum { PINGS = 400 };
  static uint64_t rtts[PINGS];
  uint8_t echo_buf[64];
  int pinged = 0;
  for (int k = 0; k < PINGS; k++) {
    uint64_t a = now_ns();
    send(tx, payload, 64, 0);
    struct pollfd pf = {.fd = tx, .events = POLLIN};
    if (poll(&pf, 1, 200) <= 0) continue;
    if (recv(tx, echo_buf, sizeof echo_buf, 0) <= 0) continue;
    rtts[pinged++] = now_ns() - a;
  }
  qsort(rtts, pinged, sizeof rtts[0], cmp_u64);
  g_stop = 1;
  pthread_join(relay, NULL);
  pthread_join(sink, NULL);
  printf("{\"bitsPerS\":%.0f,\"packets\":%llu,\"packetBytes\":%d,\"ms\":%.1f,\"window\":%d,"
         "\"rttFloorUsMedian\":%.1f,\"rttFloorUsP90\":%.1f,\"pings\":%d}\n",
         bits, got, packet_bytes, secs * 1e3, window,
         pinged ? rtts[pinged / 2] / 1e3 : -1.0, pinged ? rtts[pinged * 9 / 10] / 1e3 : -1.0,
         pinged);
  return 0;
}

int main(int argc, char **argv) {
  long listen_port = 0, target_port = -1, ceiling = 0, seed = 1;
  int packet_bytes = 1200, window = 256, nice_level = 0;
  g_shape = (shape_t){.rate_bps = 1e9, .delay_ns = 0, .loss = 0, .queue_bytes = 1 << 20};
  for (int k = 1; k + 1 < argc; k += 2) {
    const char *o = argv[k], *v = argv[k + 1];
    if (!strcmp(o, "--listen")) listen_port = atol(v);
    else if (!strcmp(o, "--target")) target_port = atol(v);
    else if (!strcmp(o, "--rate")) g_shape.rate_bps = atof(v);
    else if (!strcmp(o, "--delay-us")) g_shape.delay_ns = (uint64_t)(atof(v) * 1000);
    else if (!strcmp(o, "--loss")) g_shape.loss = atof(v);
    else if (!strcmp(o, "--queue-bytes")) g_shape.queue_bytes = strtoull(v, NULL, 10);
    else if (!strcmp(o, "--seed")) seed = atol(v);
    else if (!strcmp(o, "--clients-max")) g_clients_max = atoi(v);
    else if (!strcmp(o, "--ceiling")) ceiling = atol(v);
    else if (!strcmp(o, "--packet-bytes")) packet_bytes = atoi(v);
    else if (!strcmp(o, "--window")) window = atoi(v);
    else if (!strcmp(o, "--nice")) nice_level = atoi(v);
    else {
      fprintf(stderr, "link_relay: unknown option %s\n", o);
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_TIMERSLACK, 1000UL); /* 1 us: wake for a due packet, not 50 us later */
  /* The relay is the measuring instrument: on a shared machine it asks to be scheduled ahead
   * of ordinary work (it only runs while packets are due), where allowed; lateness is still
   * measured and reported. */
  if (nice_level != 0) setpriority(PRIO_PROCESS, 0, nice_level);
  if (g_clients_max < 1 || g_clients_max > CLIENTS_MAX) g_clients_max = CLIENTS_MAX;
  if (packet_bytes < 64 || packet_bytes > SLOT_BYTES) packet_bytes = 1200;
  if (ceiling > 0) return run_ceiling(ceiling, packet_bytes, window);
  if (target_port < 0 || !(g_shape.rate_bps > 0)) {
    fprintf(stderr, "link_relay: --target PORT and a positive --rate are required\n");
    return 2;
  }
  g_target.sin_family = AF_INET;
  g_target.sin_port = htons((uint16_t)target_port);
  g_target.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  g_listener = udp_socket((uint16_t)listen_port);
  pipe_init(&g_fwd, (uint64_t)seed);
  pipe_init(&g_bwd, (uint64_t)seed ^ 0x9e3779b9ull);
  printf("ready %u\n", port_of(g_listener));
  fflush(stdout);
  relay_loop(1);
  return 0;
}
