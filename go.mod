module github.com/tensorferry/tensorferry

go 1.26
