from epic_slime.cli import main

raise SystemExit(main())
