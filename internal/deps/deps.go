// Package deps pins the module's dependencies until code imports them. Temporary.
package deps

import (
	_ "github.com/emersion/go-smtp"
	_ "github.com/go-telegram-bot-api/telegram-bot-api/v5"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/rabbitmq/amqp091-go"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/slack-go/slack"
	_ "go.mongodb.org/mongo-driver/v2/mongo"
	_ "gopkg.in/gomail.v2"
	_ "gopkg.in/yaml.v3"
)
