import sys

from .files import main

sys.exit(main())
