from traceops.cli import main

main()
