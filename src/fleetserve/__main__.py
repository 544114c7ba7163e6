from fleetserve.cli.app import main

main()
