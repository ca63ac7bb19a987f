import sys

from npudoctor.cli import main

sys.exit(main())
