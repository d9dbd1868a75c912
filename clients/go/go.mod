module lockd.dev/lockd

go 1.19
