/* A QEMU TCG plugin: how many times each x86 instruction (by mnemonic) was executed.
 *
 * Built and used by bench/instruction_census.py, which says why (an emulator computes every
 * instruction exactly; a real CPU does too, except for the few whose results the manuals leave to
 * the implementation, so a run that executes none of those computes on a real CPU what it computes
 * under the emulator). Usage:
 *
 *     cc -shared -fPIC -O2 -o libqemu_census.so bench/qemu_census.c
 *     qemu-x86_64 -cpu Haswell-noTSX -plugin ./libqemu_census.so,out=census.tsv PROGRAM ARGS...
 *
 * census.tsv has one line per mnemonic: the mnemonic and how many times it ran. Prefixes (rep,
 * lock, ...) stay with the mnemonic.
 *
 * The plugin API of QEMU 7.2 (Debian 12's qemu-user; API version 1) is declared below, only the
 * part used here, so that no QEMU source is needed to build it. Every execution of an instruction
 * adds 1 to its mnemonic's counter (an inline add, no call into the plugin), so counting costs
 * little beyond the emulation itself. The adds are not atomic: with several guest threads a count
 * can come out low, never zero for an instruction that ran.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- QEMU 7.2 plugin API (include/qemu/qemu-plugin.h, version 1), the part used here ---- */
typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t; /* only passed through */
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_insn_exec_inline(struct qemu_plugin_insn *insn, enum qemu_plugin_op op,
                                                void *ptr, uint64_t imm);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
char *qemu_plugin_insn_disas(const struct qemu_plugin_insn *insn);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
void qemu_plugin_outs(const char *string);
__attribute__((visibility("default"))) int qemu_plugin_version = 1;
/* ---- end of the API ---- */

#define SLOTS 16384 /* distinct mnemonics; x86 has a few thousand */

struct mnemonic {
    uint64_t count; /* 8-byte aligned: the inline add's target */
    char *name;
};

static struct mnemonic table[SLOTS]; /* never moves: translated code holds pointers into it */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static char *out_path;
static int table_full;

static const char *PREFIXES[] = {"rep", "repe", "repz", "repne", "repnz", "lock", "notrack", "bnd",
                                 "data16", "addr32", "xacquire", "xrelease", NULL};

static int is_prefix(const char *word, size_t n) {
    for (const char **p = PREFIXES; *p; p++)
        if (strlen(*p) == n && strncmp(*p, word, n) == 0) return 1;
    return 0;
}

/* The mnemonic of a disassembled instruction ("vfmadd231ps ymm0, ..." -> "vfmadd231ps"), with its
 * prefixes ("rep movsb ..." -> "rep movsb"), written to `buf`. */
static void mnemonic_of(const char *disas, char *buf, size_t size) {
    size_t used = 0;
    const char *s = disas;
    for (;;) {
        while (*s == ' ' || *s == '\t') s++;
        size_t n = strcspn(s, " \t");
        if (n == 0) break;
        if (used && used + 1 < size) buf[used++] = ' ';
        for (size_t i = 0; i < n && used + 1 < size; i++) buf[used++] = s[i];
        if (!is_prefix(s, n)) break;
        s += n;
    }
    buf[used] = '\0';
}

static struct mnemonic *lookup(const char *name) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    for (size_t probe = 0; probe < SLOTS; probe++) {
        struct mnemonic *m = &table[(h + probe) % SLOTS];
        if (m->name == NULL) {
            m->name = strdup(name);
            return m;
        }
        if (strcmp(m->name, name) == 0) return m;
    }
    table_full = 1;
    return NULL;
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    char name[128];
    pthread_mutex_lock(&table_lock);
    for (size_t i = 0, n = qemu_plugin_tb_n_insns(tb); i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        char *disas = qemu_plugin_insn_disas(insn);
        mnemonic_of(disas ? disas : "(undisassembled)", name, sizeof name);
        free(disas);
        struct mnemonic *m = lookup(name[0] ? name : "(empty)");
        if (m) qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64, &m->count, 1);
    }
    pthread_mutex_unlock(&table_lock);
}

static void write_census(qemu_plugin_id_t id, void *userdata) {
    (void)id;
    (void)userdata;
    FILE *f = fopen(out_path, "w");
    if (f == NULL) {
        qemu_plugin_outs("qemu_census: cannot write the census file\n");
        return;
    }
    if (table_full) fprintf(f, "# table full: some mnemonics were not counted\n");
    for (size_t i = 0; i < SLOTS; i++)
        if (table[i].name) fprintf(f, "%s\t%llu\n", table[i].name, (unsigned long long)table[i].count);
    fclose(f);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                                               int argc, char **argv) {
    (void)info;
    for (int i = 0; i < argc; i++)
        if (strncmp(argv[i], "out=", 4) == 0) out_path = strdup(argv[i] + 4);
    if (out_path == NULL) {
        fprintf(stderr, "qemu_census: give out=FILE\n");
        return -1;
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, write_census, NULL);
    return 0;
}
