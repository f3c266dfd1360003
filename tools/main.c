/* main.c - the vramkit command: a dispatcher to one file per subcommand.
 *
 *   vramkit replay ...   trace replay (replay.c)
 *   vramkit bench ...    benchmarks: random, pair, scale (bench.c)
 */
#include "cli.h"

#include <errno.h>
#include <string.h>

static const char usage_head[] =
    "usage: vramkit COMMAND [options]\n"
    "\n"
    "vramkit " VRAMKIT_VERSION ": a caching GPU memory allocator, its replay and benchmarks.\n"
    "\n"
    "commands:\n"
    "  replay    replay allocation traces (format v1) and report fragmentation and speed\n"
    "  bench     benchmarks: random workload, alloc+free pair, scaling with live blocks\n"
    "  help      this text\n";
static const char usage_tail[] =
    "\n"
    "vramkit COMMAND --help describes a command. --version prints the version.\n"
    "\n" CLI_EXIT_STATUS_HELP;

/* The Python package's subcommands, when its dispatcher started this program to print the
 * one usage ("--also-commands" first, then lines of "name<TAB>summary"): the package runs
 * this program rather than reading its text, so that the usage has one owner. */
static const char *also_commands;

static void print_usage(FILE *out) {
  fputs(usage_head, out);
  for (const char *line = also_commands; line && *line;) {
    const char *tab = strchr(line, '\t'), *end = strchr(line, '\n');
    if (!end) end = line + strlen(line);
    if (tab && tab < end) fprintf(out, "  %-10.*s%.*s\n", (int)(tab - line), line,
                                  (int)(end - tab - 1), tab + 1);
    line = *end ? end + 1 : end;
  }
  fputs(usage_tail, out);
}

/* The VRAMKIT_* variables, from the library's one table of them. */
static void print_variables(FILE *out) {
  fputs("\nenvironment (a VRAMKIT_* name not listed here is ignored, with a warning):\n", out);
  const char *name, *help = NULL;
  /* The name first, then the help it set: a call's arguments are evaluated in no set
   * order, so the two must not meet in one call. */
  for (size_t i = 0; (name = vram_env_variable(i, &help, NULL)) != NULL; i++)
    fprintf(out, "  %-26s %s\n", name, help);
}

static int dispatch(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "--also-commands") == 0) {
    also_commands = argv[2];
    argv[2] = argv[0];
    argv += 2;
    argc -= 2;
  }
  if (argc < 2) {
    print_usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *command = argv[1];
  /* "help replay" names a command; after --help or --version a word is one the script did
   * not mean, refused rather than read as a success of what it asked. */
  if ((cli_is_help(command) || strcmp(command, "--version") == 0 ||
       strcmp(command, "version") == 0) && argc > 2) {
    fprintf(stderr, "vramkit %s: unknown argument '%s' (see vramkit --help)\n", command,
            cli_shown(argv[2]));
    return CLI_EXIT_USAGE;
  }
  if (cli_is_help(command) || strcmp(command, "help") == 0) {
    /* "vramkit help replay" reads naturally; send it to the command's own --help. */
    if (argc > 3 && strcmp(command, "help") == 0) {
      fprintf(stderr, "vramkit help: one command at a time, not %d words (see vramkit "
                      "--help)\n", argc - 2);
      return CLI_EXIT_USAGE;
    }
    if (argc > 2 && strcmp(command, "help") == 0 && !cli_is_help(argv[2]) &&
        strcmp(argv[2], "help") != 0) {
      char help_flag[] = "--help";
      char *help_argv[] = {argv[2], help_flag, NULL};
      if (strcmp(argv[2], "replay") == 0) return cmd_replay(2, help_argv);
      if (strcmp(argv[2], "bench") == 0) return cmd_bench(2, help_argv);
      fprintf(stderr, "vramkit: unknown command '%s' (see vramkit --help)\n",
              cli_shown(argv[2]));
      return CLI_EXIT_USAGE;
    }
    print_usage(stdout);
    print_variables(stdout);
    return CLI_EXIT_OK;
  }
  if (strcmp(command, "--version") == 0 || strcmp(command, "version") == 0) {
    printf("vramkit %s\n", VRAMKIT_VERSION);
    return CLI_EXIT_OK;
  }
  if (strcmp(command, "replay") == 0) {
    cli_set_command("vramkit replay");
    return cmd_replay(argc - 1, argv + 1);
  }
  if (strcmp(command, "bench") == 0) {
    cli_set_command("vramkit bench");
    return cmd_bench(argc - 1, argv + 1);
  }
  fprintf(stderr, "vramkit: unknown command '%s' (see vramkit --help)\n", cli_shown(command));
  return CLI_EXIT_USAGE;
}

/* What was printed must have reached standard output: a full disk or an I/O error there
 * is a failure with one line on stderr, never a success whose report was lost. */
int main(int argc, char **argv) {
  int status = dispatch(argc, argv);
  errno = 0;
  if (fflush(stdout) != 0 || ferror(stdout)) {
    if (errno)
      fprintf(stderr, "vramkit: cannot write standard output: %s\n", strerror(errno));
    else
      fputs("vramkit: cannot write standard output\n", stderr);
    return CLI_EXIT_FAILURE;
  }
  return status;
}
