"""`python -m atom_aot.server ART [--host ...]` (also `atom-run ART serve ...`)."""
import sys


def main(argv=None) -> int:
    print("error: the OpenAI-compatible server is not available yet in this version of atom-aot",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
