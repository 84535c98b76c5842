from kerneltriage.cli.main import main

raise SystemExit(main())
