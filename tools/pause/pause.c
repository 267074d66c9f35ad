/*
 * The pod sandbox's first process (what registry.k8s.io/pause runs), built by the
 * project because no image registry is reachable from its machines: it holds the
 * pod's namespaces open, reaps the orphans a shared PID namespace hands it, and
 * exits on SIGINT or SIGTERM. tests/support/realnode/images.py compiles it with
 * `gcc -static` into an image that holds only this file.
 */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int signal_number) {
    (void)signal_number;
    _exit(0);
}

static void reap(int signal_number) {
    (void)signal_number;
    while (waitpid(-1, 0, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_quit = {.sa_handler = quit};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    if (getpid() != 1) {
        /* Run outside a sandbox it would hold nothing open; say so rather than hang. */
        static const char message[] = "pause: meant to run as PID 1 of a pod sandbox\n";
        (void)!write(2, message, sizeof message - 1);
    }
    if (sigaction(SIGINT, &on_quit, 0) || sigaction(SIGTERM, &on_quit, 0) ||
        sigaction(SIGCHLD, &on_child, 0)) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
