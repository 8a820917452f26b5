/* The ceiling of benchmarks/kafka_produce_bench.py (issue 55): a plain librdkafka producer
 * loop in C, rd_kafka_produce() per record with RD_KAFKA_MSG_F_COPY, in one transaction of
 * its own transactional producer, on the same librdkafka the Python contenders load.
 *
 * Built by the bench at run time (gcc, no rdkafka.h needed: the few public functions are
 * declared below as librdkafka 2.x's rdkafka.h declares them) and driven over stdin/stdout:
 *
 *   rdkafka_loop RECORDS_FILE TOPIC key=value ...   (librdkafka settings)
 *   stdin "run\n"  -> one transaction of every record; stdout "<wall s> <cpu s>\n"
 *   stdin "quit\n" -> exit 0
 *
 * RECORDS_FILE: per record int32 partition, int32 key length, int32 value length (native
 * byte order), then the key's and the value's bytes. Any error: a line on stderr, exit 1.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_error_s rd_kafka_error_t;
typedef struct rd_kafka_message_s {
    int err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;

rd_kafka_conf_t *rd_kafka_conf_new(void);
int rd_kafka_conf_set(rd_kafka_conf_t *, const char *, const char *, char *, size_t);
void rd_kafka_conf_set_dr_msg_cb(rd_kafka_conf_t *,
                                 void (*)(rd_kafka_t *, const rd_kafka_message_t *, void *));
rd_kafka_t *rd_kafka_new(int, rd_kafka_conf_t *, char *, size_t);
rd_kafka_topic_t *rd_kafka_topic_new(rd_kafka_t *, const char *, void *);
int rd_kafka_produce(rd_kafka_topic_t *, int32_t, int, void *, size_t, const void *, size_t,
                     void *);
int rd_kafka_last_error(void);
int rd_kafka_poll(rd_kafka_t *, int);
rd_kafka_error_t *rd_kafka_init_transactions(rd_kafka_t *, int);
rd_kafka_error_t *rd_kafka_begin_transaction(rd_kafka_t *);
rd_kafka_error_t *rd_kafka_commit_transaction(rd_kafka_t *, int);
const char *rd_kafka_error_string(const rd_kafka_error_t *);
void rd_kafka_topic_destroy(rd_kafka_topic_t *);
void rd_kafka_destroy(rd_kafka_t *);

#define RD_KAFKA_PRODUCER 0
#define RD_KAFKA_MSG_F_COPY 0x2
#define ERR_QUEUE_FULL (-184)

static long failed;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    (void)opaque;
    if (m->err) failed++;
}

static void check(rd_kafka_error_t *error, const char *what) {
    if (error) {
        fprintf(stderr, "%s: %s\n", what, rd_kafka_error_string(error));
        exit(1);
    }
}

static double seconds(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    char errstr[512], line[64];
    if (argc < 3) {
        fprintf(stderr, "usage: rdkafka_loop RECORDS_FILE TOPIC key=value ...\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)size);
    if (!data || fread(data, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 1;
    }
    fclose(f);
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    for (int i = 3; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) {
            fprintf(stderr, "not key=value: %s\n", argv[i]);
            return 2;
        }
        *eq = '\0';
        if (rd_kafka_conf_set(conf, argv[i], eq + 1, errstr, sizeof errstr) != 0) {
            fprintf(stderr, "%s\n", errstr);
            return 1;
        }
    }
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
    if (!rk) {
        fprintf(stderr, "%s\n", errstr);
        return 1;
    }
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, argv[2], NULL);
    check(rd_kafka_init_transactions(rk, 60000), "init_transactions");
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "quit", 4) == 0) break;
        double wall = seconds(CLOCK_MONOTONIC), cpu = seconds(CLOCK_PROCESS_CPUTIME_ID);
        check(rd_kafka_begin_transaction(rk), "begin_transaction");
        for (long at = 0; at < size;) {
            int32_t head[3];
            memcpy(head, data + at, sizeof head);
            char *key = data + at + sizeof head, *value = key + head[1];
            while (rd_kafka_produce(rkt, head[0], RD_KAFKA_MSG_F_COPY, value, (size_t)head[2],
                                    key, (size_t)head[1], NULL) == -1) {
                if (rd_kafka_last_error() != ERR_QUEUE_FULL) {
                    fprintf(stderr, "produce: error %d\n", rd_kafka_last_error());
                    return 1;
                }
                rd_kafka_poll(rk, 1);
            }
            at += (long)sizeof head + head[1] + head[2];
        }
        check(rd_kafka_commit_transaction(rk, 120000), "commit_transaction");
        rd_kafka_poll(rk, 0);
        if (failed) {
            fprintf(stderr, "%ld records failed delivery\n", failed);
            return 1;
        }
        printf("%.6f %.6f\n", seconds(CLOCK_MONOTONIC) - wall,
               seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu);
        fflush(stdout);
    }
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    free(data);
    return 0;
}
