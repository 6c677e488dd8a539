from kubesweep.cli import main

main()
