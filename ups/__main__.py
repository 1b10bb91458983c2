from ups.cli.app import main

main()
