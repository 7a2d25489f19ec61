from rrfp_cli.app import main

main()
