FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY singleton ./singleton
COPY listeners ./listeners
RUN pip install --no-cache-dir .
COPY deploy/singleton.toml /etc/singleton/singleton.toml
ENV SINGLETON_CONFIG=/etc/singleton/singleton.toml
EXPOSE 9464
ENTRYPOINT ["singleton"]
CMD ["run"]
