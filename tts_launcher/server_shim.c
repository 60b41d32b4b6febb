/*
 * Preloaded into tritonserver (LD_PRELOAD) by the launcher, for what Triton 2.51 cannot be told:
 *
 * 1. The admin key (and the inner key behind the front door) stays out of /proc/PID/cmdline,
 *    which every local user can read.
 *
 * Triton 2.51 takes the restricted-API key only as a command-line flag. The launcher starts
 * tritonserver with a placeholder in that flag and the key in TTS_TRITON_ADMIN_KEY (a process's
 * environment is readable by its own user only), with this library in LD_PRELOAD. Before
 * main() runs, this constructor points the argv entries holding the placeholder at heap copies
 * holding the key: main() parses the key, while /proc/PID/cmdline (the original argument
 * memory) shows only the placeholder. It then drops the key and LD_PRELOAD from the
 * environment, so the Python-backend stubs inherit neither. The launcher checks afterwards
 * that the key works, so a shim that did not load fails closed (tts_launcher/children.py).
 *
 * 2. Shared-memory regions stay the server user's own. The Python backend creates each stub's
 *    region in /dev/shm and boost.interprocess then fchmod()s it to 0644 whatever the umask, so
 *    request text and audio were readable by any local user. fchmod() on a /dev/shm file keeps
 *    only the owner's bits here.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

int fchmod(int fd, mode_t mode) {
    static int (*real_fchmod)(int, mode_t) = NULL;
    if (real_fchmod == NULL) {
        real_fchmod = (int (*)(int, mode_t))dlsym(RTLD_NEXT, "fchmod");
    }
    char link[64], path[512];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n > 0) {
        path[n] = '\0';
        if (strncmp(path, "/dev/shm/", 9) == 0) {
            mode &= S_IRWXU;
        }
    }
    return real_fchmod(fd, mode);
}

/* (placeholder, variable) pairs: the admin key, and the inner key behind the front door. */
static const char *const KEYS[][2] = {
    {"tts-admin-key-hidden", "TTS_TRITON_ADMIN_KEY"},
    {"tts-inner-key-hidden", "TTS_TRITON_INNER_KEY"},
};

static void tts_replace(int argc, char **argv, const char *mark, const char *key) {
    size_t key_len = strlen(key), mark_len = strlen(mark);
    for (int i = 1; i < argc; i++) {
        char *at = argv[i] ? strstr(argv[i], mark) : NULL;
        if (at == NULL) {
            continue;
        }
        size_t prefix = (size_t)(at - argv[i]), rest = strlen(at + mark_len);
        char *arg = malloc(prefix + key_len + rest + 1);
        if (arg == NULL) {
            abort(); /* never start with the placeholder as a usable key */
        }
        memcpy(arg, argv[i], prefix);
        memcpy(arg + prefix, key, key_len);
        memcpy(arg + prefix + key_len, at + mark_len, rest + 1);
        argv[i] = arg;
    }
}

/* Only tritonserver itself: the launcher may start it through a wrapper that execs it (setpriv,
 * for the parent-death signal), which must pass the placeholders and the environment on. */
static int tts_is_tritonserver(const char *program) {
    const char *name = program ? strrchr(program, '/') : NULL;
    name = name ? name + 1 : program;
    return name != NULL && strcmp(name, "tritonserver") == 0;
}

__attribute__((constructor)) static void tts_hide_admin_key(int argc, char **argv, char **envp) {
    (void)envp;
    if (argv == NULL || argc < 1 || !tts_is_tritonserver(argv[0])) {
        return;
    }
    for (size_t k = 0; k < sizeof KEYS / sizeof KEYS[0]; k++) {
        const char *key = getenv(KEYS[k][1]);
        if (key != NULL) {
            tts_replace(argc, argv, KEYS[k][0], key);
            unsetenv(KEYS[k][1]);
        }
    }
    unsetenv("LD_PRELOAD");
}
